//! The simulated TEE: SEV-SNP reports in the real format (the `sev` crate's
//! `AttestationReport` layout, version 3, Milan CPUID), signed by a test VCEK that chains
//! VCEK→ASK→ARK to a test root. The hierarchy is fixed: `attestation/testdata/sim/generate.sh`
//! made it once and its files are committed (the ARK and ASK private keys were discarded).
//!
//! Only a policy that names the test ARK's fingerprint trusts this evidence; the production
//! policy rejects it, and every appraisal of it says "simulated".

use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P384_SHA384_FIXED_SIGNING, EcdsaKeyPair};
use sev::parser::ByteParser;
use sha2::{Digest, Sha384};
use zeroize::Zeroizing;

use super::{CollectError, EvidenceSource, PlatformEvidence};
use crate::abi::snp::SnpReport;
use crate::evidence::{Base64Bytes, SnpCert, SnpCertKind, SnpEvidence};
use crate::report::TcbClaims;

/// The test ARK certificate (DER).
pub const ARK_DER: &[u8] = include_bytes!("../../testdata/sim/ark.der");
/// The test ASK certificate (DER).
pub const ASK_DER: &[u8] = include_bytes!("../../testdata/sim/ask.der");
/// The test VCEK certificate (DER), valid 2025 to 2050.
pub const VCEK_DER: &[u8] = include_bytes!("../../testdata/sim/vcek.der");
/// The test ASVK certificate (DER), intermediate for the VLEK.
pub const ASVK_DER: &[u8] = include_bytes!("../../testdata/sim/asvk.der");
/// The test VLEK certificate (DER), valid 2025 to 2050.
pub const VLEK_DER: &[u8] = include_bytes!("../../testdata/sim/vlek.der");
/// The same VCEK key certified only for 2020 (for expiry tests).
pub const VCEK_EXPIRED_DER: &[u8] = include_bytes!("../../testdata/sim/vcek-expired.der");
const VCEK_KEY_PEM: &[u8] = include_bytes!("../../testdata/sim/vcek.key.pem");
const VLEK_KEY_PEM: &[u8] = include_bytes!("../../testdata/sim/vlek.key.pem");
const CHIP_ID_HEX: &str = include_str!("../../testdata/sim/chip_id.hex");

/// The TCB the test VCEK certifies.
pub const SIMULATED_TCB: TcbClaims = TcbClaims {
    fmc: None,
    bootloader: 3,
    tee: 0,
    snp: 8,
    microcode: 115,
};

/// SHA-256 of [`ARK_DER`], hex: the fingerprint a development policy names.
pub fn ark_fingerprint() -> String {
    hex::encode(crate::pki::sha256(ARK_DER))
}

/// A simulated SEV-SNP guest. Its public fields shape the reports it produces.
pub struct SimulatedSnp {
    /// Guest policy word (default 0x30000: SMT allowed, debug off).
    pub guest_policy: u64,
    /// VMPL reported.
    pub vmpl: u32,
    /// Launch measurement reported.
    pub measurement: [u8; 48],
    /// HOST_DATA reported.
    pub host_data: [u8; 32],
    /// REPORTED_TCB (must equal [`SIMULATED_TCB`] for the chain to bind).
    pub reported_tcb: TcbClaims,
    /// The VCEK certificate supplied with reports.
    pub vcek_der: Vec<u8>,
    /// Sign with the test VLEK (KEY_INFO names a VLEK; the VLEK→ASVK→ARK chain is supplied)
    /// instead of the VCEK.
    pub use_vlek: bool,
    vcek_key: EcdsaKeyPair,
    vlek_key: EcdsaKeyPair,
    chip_id: [u8; 64],
}

impl std::fmt::Debug for SimulatedSnp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatedSnp")
            .field("guest_policy", &self.guest_policy)
            .field("vmpl", &self.vmpl)
            .finish_non_exhaustive()
    }
}

/// The measurement a simulated guest reports by default: SHA-384 of a fixed label.
pub fn default_measurement() -> [u8; 48] {
    Sha384::digest(b"inferno simulated launch").into()
}

impl SimulatedSnp {
    /// A simulated guest with the fixed test hierarchy and default report fields.
    pub fn new() -> Result<Self, CollectError> {
        let vcek_key = load_key(VCEK_KEY_PEM, "simulated VCEK key")?;
        let vlek_key = load_key(VLEK_KEY_PEM, "simulated VLEK key")?;
        let chip_id: [u8; 64] = hex::decode(CHIP_ID_HEX.trim())
            .ok()
            .and_then(|v| v.try_into().ok())
            .ok_or_else(|| {
                CollectError::Platform("simulated chip_id.hex is not 64 bytes of hex".into())
            })?;
        Ok(Self {
            guest_policy: 0x30000,
            vmpl: 0,
            measurement: default_measurement(),
            host_data: [0; 32],
            reported_tcb: SIMULATED_TCB,
            vcek_der: VCEK_DER.to_vec(),
            use_vlek: false,
            vcek_key,
            vlek_key,
            chip_id,
        })
    }

    /// Produces a signed report (raw bytes) over `report_data`.
    pub fn signed_report(&self, report_data: &[u8; 64]) -> Result<Vec<u8>, CollectError> {
        use sev::firmware::guest::{AttestationReport, GuestPolicy};
        use sev::firmware::host::TcbVersion;
        let t = self.reported_tcb;
        let tcb = TcbVersion::new(None, t.bootloader, t.tee, t.snp, t.microcode);
        let report = AttestationReport {
            version: 3,
            guest_svn: 1,
            policy: GuestPolicy::from(self.guest_policy),
            vmpl: self.vmpl,
            sig_algo: crate::abi::snp::SIG_ALGO_ECDSA_P384_SHA384,
            // KEY_INFO bits 4:2 name the signing key: 0 VCEK, 1 VLEK.
            key_info: sev::firmware::guest::KeyInfo::from(if self.use_vlek {
                1u32 << 2
            } else {
                0
            }),
            current_tcb: tcb,
            report_data: *report_data,
            measurement: self.measurement,
            host_data: self.host_data,
            reported_tcb: tcb,
            cpuid_fam_id: Some(0x19),
            cpuid_mod_id: Some(0x01),
            cpuid_step: Some(0x01),
            chip_id: self.chip_id,
            committed_tcb: tcb,
            launch_tcb: tcb,
            ..Default::default()
        };
        let bytes = report
            .to_bytes()
            .map_err(|e| CollectError::Platform(format!("encoding simulated report: {e}")))?;
        let mut parsed = SnpReport::parse(&bytes)
            .map_err(|e| CollectError::Platform(format!("simulated report: {e}")))?;
        let key = if self.use_vlek {
            &self.vlek_key
        } else {
            &self.vcek_key
        };
        let sig = key
            .sign(&SystemRandom::new(), parsed.signed_bytes())
            .map_err(|_| CollectError::Platform("simulated VCEK signing failed".into()))?;
        let sig: [u8; 96] = sig
            .as_ref()
            .try_into()
            .map_err(|_| CollectError::Platform("simulated signature is not 96 bytes".into()))?;
        parsed.set_signature_p1363(&sig);
        Ok(parsed.as_bytes().to_vec())
    }
}

fn load_key(pem: &[u8], what: &str) -> Result<EcdsaKeyPair, CollectError> {
    let der = crate::pki::pem_blocks(pem, what)
        .map_err(|e| CollectError::Platform(e.to_string()))?
        .into_iter()
        .next()
        .map(Zeroizing::new)
        .ok_or_else(|| CollectError::Platform(format!("{what}: empty PEM")))?;
    EcdsaKeyPair::from_pkcs8(&ECDSA_P384_SHA384_FIXED_SIGNING, &der, &SystemRandom::new())
        .map_err(|e| CollectError::Platform(format!("{what} rejected: {e}")))
}

impl EvidenceSource for SimulatedSnp {
    fn collect(&self, report_data: &[u8; 64]) -> Result<PlatformEvidence, CollectError> {
        let report = self.signed_report(report_data)?;
        let cert = |kind, der: &[u8]| SnpCert {
            kind,
            der: Base64Bytes(der.to_vec()),
        };
        Ok(PlatformEvidence::SevSnp(SnpEvidence {
            report: Base64Bytes(report),
            certs: if self.use_vlek {
                vec![
                    cert(SnpCertKind::Vlek, VLEK_DER),
                    cert(SnpCertKind::Asvk, ASVK_DER),
                    cert(SnpCertKind::Ark, ARK_DER),
                ]
            } else {
                vec![
                    cert(SnpCertKind::Vcek, &self.vcek_der),
                    cert(SnpCertKind::Ask, ASK_DER),
                    cert(SnpCertKind::Ark, ARK_DER),
                ]
            },
            hcl_report: None,
        }))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_verifier_names_this_test_ark() {
        assert_eq!(
            super::ark_fingerprint(),
            crate::verify::snp::SIMULATED_ARK_SHA256
        );
    }
}
