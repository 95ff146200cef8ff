//! A simulated H100 for development and CI: SPDM GET_MEASUREMENTS reports in the real format,
//! signed by a P-384 device key under a three-level test chain derived from a seed.
//!
//! Keys are derived deterministically from the seed (SHA-384 of a label, retried until it is
//! a valid scalar), and certificates use fixed serials, names and validity, with
//! deterministic (RFC 6979) signatures: the same seed always gives the same root, so a
//! development policy can name it. Production trust ([`super::GpuTrust::nvidia`]) never
//! contains it, and claims from it are marked [`super::GpuClaims::simulated`].

use std::str::FromStr as _;

use der::asn1::{GeneralizedTime, ObjectIdentifier, OctetString};
use der::oid::AssociatedOid;
use der::{DateTime, Decode as _, Encode as _};
use p384::ecdsa::signature::Signer as _;
use p384::ecdsa::{DerSignature, Signature, SigningKey};
use x509_cert::builder::{Builder as _, CertificateBuilder, Profile};
use x509_cert::ext::pkix::CrlReason;
use x509_cert::ext::{AsExtension, Extension};
use x509_cert::name::Name;
use x509_cert::serial_number::SerialNumber;
use x509_cert::spki::SubjectPublicKeyInfoOwned;
use x509_cert::time::{Time, Validity};
use x509_ocsp::builder::OcspResponseBuilder;
use x509_ocsp::{
    CertId, CertStatus, OcspGeneralizedTime, ResponderId, RevokedInfo, SingleResponse,
};
use zeroize::Zeroizing;

use super::error::GpuError;
use super::evidence::{CcMode, GpuEvidence};
use super::opaque::{FIELD_DRIVER_VERSION, FIELD_FWID, FIELD_PROJECT, FIELD_VBIOS_VERSION};
use super::spdm::NONCE_LEN;

/// The seed the test suite and the development policy use.
pub const TEST_SEED: &[u8] = b"inferno simulated GPU test seed v1";
/// id-sha384, the FWID hash algorithm.
const OID_SHA384: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.2");

/// What the simulated GPU reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimulatedGpuConfig {
    /// Driver version in the opaque data.
    pub driver_version: String,
    /// VBIOS version as printed (`96.00.9F.00.01`: five hex bytes).
    pub vbios_version: String,
    /// Number of measurement blocks (1-based indices).
    pub measurement_count: u8,
    /// CC mode the simulated driver reports.
    pub cc_mode: CcMode,
    /// Ready state the simulated driver reports.
    pub ready_state: bool,
}

impl Default for SimulatedGpuConfig {
    fn default() -> Self {
        Self {
            driver_version: "550.90.07".into(),
            vbios_version: "96.00.9F.00.01".into(),
            measurement_count: 64,
            cc_mode: CcMode::On,
            ready_state: false,
        }
    }
}

/// A simulated GPU: its test chain and device key.
pub struct SimulatedGpu {
    seed: Zeroizing<Vec<u8>>,
    config: SimulatedGpuConfig,
    chain: Vec<Vec<u8>>,
    root_key: SigningKey,
    ica_key: SigningKey,
    device_key: SigningKey,
    fwid: [u8; 48],
}

/// A certificate of the simulated hierarchy (the chain is device, ICA, root).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimulatedCert {
    /// The self-signed root.
    Root,
    /// The intermediate CA, issued by the root.
    Ica,
    /// The device leaf, issued by the ICA.
    Device,
}

impl SimulatedCert {
    /// Position in the chain (leaf first).
    fn index(self) -> usize {
        match self {
            Self::Device => 0,
            Self::Ica => 1,
            Self::Root => 2,
        }
    }

    /// The certificate that issued this one (the root issued itself).
    fn issuer(self) -> Self {
        match self {
            Self::Device => Self::Ica,
            Self::Ica | Self::Root => Self::Root,
        }
    }
}

/// What a simulated OCSP response says, and who signs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimulatedOcsp {
    /// The certificate whose status it gives (CertID with SHA-256).
    pub subject: SimulatedCert,
    /// `None`: good; otherwise revoked (at `this_update`) for this reason.
    pub revoked: Option<CrlReason>,
    /// thisUpdate (and producedAt).
    pub this_update: time::OffsetDateTime,
    /// nextUpdate.
    pub next_update: time::OffsetDateTime,
    /// Whose key signs it; the responder ID names that certificate. When it is not the
    /// subject's issuer, its certificate is attached as a would-be delegated responder.
    pub signer: SimulatedCert,
}

impl std::fmt::Debug for SimulatedGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatedGpu")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The TCG DICE TcbInfo extension, carrying only the FWID list.
#[derive(Clone, Debug, Eq, PartialEq, der::Sequence)]
struct DiceTcbInfo {
    #[asn1(context_specific = "6", tag_mode = "IMPLICIT", optional = "true")]
    fwids: Option<Vec<Fwid>>,
}

/// One FWID entry.
#[derive(Clone, Debug, Eq, PartialEq, der::Sequence)]
struct Fwid {
    hash_alg: ObjectIdentifier,
    digest: OctetString,
}

impl AssociatedOid for DiceTcbInfo {
    const OID: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.23.133.5.4.1");
}

impl AsExtension for DiceTcbInfo {
    fn critical(&self, _subject: &Name, _extensions: &[Extension]) -> bool {
        false
    }
}

impl SimulatedGpu {
    /// Derives the chain and device key from `seed`.
    pub fn new(seed: &[u8], config: SimulatedGpuConfig) -> Result<Self, GpuError> {
        Self::set_member(seed, 0, config)
    }

    /// GPU number `device` of a simulated protected-PCIe set: the root and ICA come from
    /// `seed` (one hierarchy for the set), the device key from `seed` and `device`. The FWID,
    /// a firmware measurement, is the same for every member, as on real GPUs that run the same
    /// firmware. Device 0 is [`SimulatedGpu::new`]'s GPU.
    pub fn set_member(
        seed: &[u8],
        device: u8,
        config: SimulatedGpuConfig,
    ) -> Result<Self, GpuError> {
        let root_key = derive_key(seed, "root")?;
        let ica_key = derive_key(seed, "ica")?;
        let mut fwid = [0u8; 48];
        fwid.copy_from_slice(&sha384(&[seed, b"fwid"]));
        let device_key = if device == 0 {
            derive_key(seed, "device")?
        } else {
            derive_key(seed, &format!("device {device}"))?
        };
        let root_name = name("CN=Inferno Simulated GPU Root CA,O=Inferno (simulated)")?;
        let ica_name = name("CN=Inferno Simulated GPU ICA,O=Inferno (simulated)")?;
        let device_name = name("CN=Inferno Simulated GPU Device,O=Inferno (simulated)")?;
        let root = certificate(
            Profile::Root,
            1,
            root_name.clone(),
            &root_key,
            &root_key,
            None,
        )?;
        let ica = certificate(
            Profile::SubCA {
                issuer: root_name,
                path_len_constraint: None,
            },
            2,
            ica_name.clone(),
            &ica_key,
            &root_key,
            None,
        )?;
        let tcb_info = DiceTcbInfo {
            fwids: Some(vec![Fwid {
                hash_alg: OID_SHA384,
                digest: OctetString::new(fwid.to_vec()).map_err(sim_err)?,
            }]),
        };
        let leaf = certificate(
            Profile::Leaf {
                issuer: ica_name,
                enable_key_agreement: false,
                enable_key_encipherment: false,
            },
            3,
            device_name,
            &device_key,
            &ica_key,
            Some(&tcb_info),
        )?;
        Ok(Self {
            seed: Zeroizing::new(seed.to_vec()),
            config,
            chain: vec![leaf, ica, root],
            root_key,
            ica_key,
            device_key,
            fwid,
        })
    }

    /// DER of the simulated root: what a development policy lists as a simulated root.
    pub fn root_der(&self) -> &[u8] {
        self.chain.last().map(Vec::as_slice).unwrap_or_default()
    }

    /// The DER certificate chain: device, ICA, root.
    pub fn chain(&self) -> &[Vec<u8>] {
        &self.chain
    }

    /// A DER OCSP response (RFC 6960, ECDSA P-384 with SHA-384) about one certificate of this
    /// hierarchy, for development bundles and tests.
    pub fn ocsp_response(&self, request: &SimulatedOcsp) -> Result<Vec<u8>, GpuError> {
        let cert = |which: SimulatedCert| {
            x509_cert::Certificate::from_der(&self.chain[which.index()]).map_err(sim_err)
        };
        let subject = cert(request.subject)?;
        let issuer = cert(request.subject.issuer())?;
        let signer_cert = cert(request.signer)?;
        let status = match request.revoked {
            None => CertStatus::good(),
            Some(reason) => CertStatus::revoked(RevokedInfo {
                revocation_time: ocsp_time(request.this_update)?,
                revocation_reason: Some(reason),
            }),
        };
        let single = SingleResponse::new(
            CertId::from_cert::<sha2::Sha256>(&issuer, &subject).map_err(sim_err)?,
            status,
            ocsp_time(request.this_update)?,
        )
        .with_next_update(ocsp_time(request.next_update)?);
        let attached =
            (request.signer != request.subject.issuer()).then(|| vec![signer_cert.clone()]);
        let mut key = match request.signer {
            SimulatedCert::Root => self.root_key.clone(),
            SimulatedCert::Ica => self.ica_key.clone(),
            SimulatedCert::Device => self.device_key.clone(),
        };
        let response = OcspResponseBuilder::new(ResponderId::ByName(
            signer_cert.tbs_certificate.subject.clone(),
        ))
        .with_single_response(single)
        .sign::<_, DerSignature>(&mut key, attached, ocsp_time(request.this_update)?)
        .map_err(sim_err)?;
        response.to_der().map_err(sim_err)
    }

    /// The value of measurement block `index` (1-based).
    pub fn measurement(&self, index: u8) -> [u8; 48] {
        let mut out = [0u8; 48];
        out.copy_from_slice(&sha384(&[&self.seed, b"measurement", &[index]]));
        out
    }

    /// A signed report for the verifier's `nonce`, with the chain and the configured states.
    pub fn evidence(&self, nonce: &[u8; NONCE_LEN]) -> Result<GpuEvidence, GpuError> {
        let mut report = vec![0x11, 0xE0, 0x01, 0xFF];
        report.extend_from_slice(nonce);
        report.push(0x00);
        let mut record = Vec::new();
        for index in 1..=self.config.measurement_count {
            record.extend_from_slice(&[index, 0x01]);
            record.extend_from_slice(&(3u16 + 48).to_le_bytes());
            record.push(0x00);
            record.extend_from_slice(&48u16.to_le_bytes());
            record.extend_from_slice(&self.measurement(index));
        }
        let record_len = u32::try_from(record.len()).map_err(sim_err)?;
        report.extend_from_slice(&[0x11, 0x60, 0x00, 0x00, self.config.measurement_count]);
        report.extend_from_slice(&record_len.to_le_bytes()[..3]);
        report.extend_from_slice(&record);
        report.extend_from_slice(&sha384(&[&self.seed, b"responder nonce", nonce])[..NONCE_LEN]);
        let opaque = self.opaque()?;
        let opaque_len = u16::try_from(opaque.len()).map_err(sim_err)?;
        report.extend_from_slice(&opaque_len.to_le_bytes());
        report.extend_from_slice(&opaque);
        let signature: Signature = self.device_key.sign(&report);
        report.extend_from_slice(&signature.to_bytes());
        Ok(GpuEvidence {
            report,
            cert_chain: self.chain.clone(),
            cc_mode: self.config.cc_mode,
            ready_state: self.config.ready_state,
        })
    }

    /// The opaque-data TLVs: driver, VBIOS, project and FWID.
    fn opaque(&self) -> Result<Vec<u8>, GpuError> {
        let mut driver = self.config.driver_version.as_bytes().to_vec();
        driver.push(0);
        let parts = self
            .config
            .vbios_version
            .split('.')
            .map(|p| u8::from_str_radix(p, 16))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| GpuError::Simulated("VBIOS version must be hex bytes".into()))?;
        let [p0, p1, p2, p3, p4] = parts.as_slice() else {
            return Err(GpuError::Simulated(
                "VBIOS version must have five parts".into(),
            ));
        };
        let vbios = [*p3, *p2, *p1, *p0, *p4, 0, 0, 0];
        let mut out = Vec::new();
        for (kind, value) in [
            (FIELD_VBIOS_VERSION, &vbios[..]),
            (FIELD_PROJECT, b"SIM0\0".as_slice()),
            (FIELD_DRIVER_VERSION, &driver[..]),
            (FIELD_FWID, &self.fwid[..]),
        ] {
            let len = u16::try_from(value.len()).map_err(sim_err)?;
            out.extend_from_slice(&kind.to_le_bytes());
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(value);
        }
        Ok(out)
    }
}

/// SHA-384 over the concatenation of `parts`.
fn sha384(parts: &[&[u8]]) -> Zeroizing<Vec<u8>> {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA384);
    for part in parts {
        ctx.update(part);
    }
    Zeroizing::new(ctx.finish().as_ref().to_vec())
}

/// Derives a P-384 key from the seed and a label.
fn derive_key(seed: &[u8], label: &str) -> Result<SigningKey, GpuError> {
    for counter in 0u8..=u8::MAX {
        let scalar = sha384(&[
            b"inferno-simulated-gpu-key",
            seed,
            label.as_bytes(),
            &[counter],
        ]);
        if let Ok(key) = SigningKey::from_slice(&scalar) {
            return Ok(key);
        }
    }
    Err(GpuError::Simulated(format!(
        "no valid {label} key from the seed"
    )))
}

/// Converts a time for an OCSP response.
fn ocsp_time(t: time::OffsetDateTime) -> Result<OcspGeneralizedTime, GpuError> {
    let secs = u64::try_from(t.unix_timestamp()).map_err(sim_err)?;
    let date =
        DateTime::from_unix_duration(std::time::Duration::from_secs(secs)).map_err(sim_err)?;
    Ok(OcspGeneralizedTime::from(date))
}

/// Parses an RFC 4514 name.
fn name(text: &str) -> Result<Name, GpuError> {
    Name::from_str(text).map_err(sim_err)
}

/// Builds one certificate, valid from 2024-01-01 to 9999-12-31.
fn certificate(
    profile: Profile,
    serial: u8,
    subject: Name,
    subject_key: &SigningKey,
    issuer_key: &SigningKey,
    tcb_info: Option<&DiceTcbInfo>,
) -> Result<Vec<u8>, GpuError> {
    let validity = Validity {
        not_before: Time::GeneralTime(GeneralizedTime::from_date_time(
            DateTime::new(2024, 1, 1, 0, 0, 0).map_err(sim_err)?,
        )),
        not_after: Time::GeneralTime(GeneralizedTime::from_date_time(
            DateTime::new(9999, 12, 31, 23, 59, 59).map_err(sim_err)?,
        )),
    };
    let spki =
        SubjectPublicKeyInfoOwned::from_key(*subject_key.verifying_key()).map_err(sim_err)?;
    let mut builder = CertificateBuilder::new(
        profile,
        SerialNumber::new(&[serial]).map_err(sim_err)?,
        validity,
        subject,
        spki,
        issuer_key,
    )
    .map_err(sim_err)?;
    if let Some(ext) = tcb_info {
        builder.add_extension(ext).map_err(sim_err)?;
    }
    let cert = builder.build::<DerSignature>().map_err(sim_err)?;
    cert.to_der().map_err(sim_err)
}

/// Wraps a builder error.
fn sim_err(e: impl std::fmt::Display) -> GpuError {
    GpuError::Simulated(e.to_string())
}
