//! SEV-SNP authenticity: the report signature by the VCEK or VLEK, the certificate chain
//! VCEK→ASK→ARK or VLEK→ASVK→ARK to a built-in AMD root (Milan, Genoa, Turin) or to a
//! simulated root that the caller explicitly trusts, certificate validity and AMD CRLs at a
//! caller-supplied `now`, and the binding of the endorsement key's extensions (TCB, hwID) to
//! the report.

use time::{Duration, OffsetDateTime};
use x509_parser::certificate::X509Certificate;

use crate::abi::snp::{Product, SIG_ALGO_ECDSA_P384_SHA384, SigningKey, SnpReport};
use crate::bundle::AmdCollateral;
use crate::evidence::{SnpCert, SnpCertKind};
use crate::pki::{self, PkiError};
use crate::report::TcbClaims;

/// Errors of SEV-SNP verification; [`SnpVerifyError::check_id`] names the failed check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnpVerifyError {
    /// The report is unsigned or uses an unknown key or algorithm.
    #[error("report is not signed by a VCEK or VLEK with ECDSA P-384 ({0})")]
    SigningKey(String),
    /// No endorsement key certificate was supplied.
    #[error("no {0} certificate supplied (evidence certificate table or collateral bundle)")]
    MissingEndorsementKey(&'static str),
    /// No supplied endorsement key chains to a trusted ARK.
    #[error("{0}")]
    Chain(String),
    /// A certificate is outside its validity at `now`.
    #[error("{0}")]
    Validity(PkiError),
    /// A CRL is invalid, stale, or revokes a certificate of the chain.
    #[error("{0}")]
    Crl(PkiError),
    /// The report signature does not verify.
    #[error("report signature does not verify with the {0} that chains to the root")]
    Signature(&'static str),
    /// The endorsement key's TCB extensions differ from REPORTED_TCB.
    #[error("{0}")]
    TcbBinding(String),
    /// The VCEK's hwID differs from CHIP_ID.
    #[error("{0}")]
    HwId(String),
    /// CPUID names another product than the chain.
    #[error("{0}")]
    Product(String),
}

impl SnpVerifyError {
    /// The check identifier this error fails.
    pub fn check_id(&self) -> &'static str {
        match self {
            SnpVerifyError::SigningKey(_) | SnpVerifyError::Signature(_) => "snp.report_signature",
            SnpVerifyError::MissingEndorsementKey(_) | SnpVerifyError::Chain(_) => "snp.chain",
            SnpVerifyError::Validity(_) => "snp.cert_validity",
            SnpVerifyError::Crl(_) => "snp.crl",
            SnpVerifyError::TcbBinding(_) => "snp.tcb_binding",
            SnpVerifyError::HwId(_) => "snp.hwid",
            SnpVerifyError::Product(_) => "snp.product",
        }
    }
}

/// What SEV-SNP verification needs besides the report.
#[derive(Debug, Clone, Copy)]
pub struct SnpVerifyInput<'a> {
    /// Certificates from the evidence (the host's certificate table).
    pub certs: &'a [SnpCert],
    /// AMD collateral from the offline bundle.
    pub collateral: Option<&'a AmdCollateral>,
    /// SHA-256 fingerprints (hex) of simulated ARKs to trust besides AMD's.
    pub trusted_simulated_arks: &'a [String],
    /// The time to check validity at.
    pub now: OffsetDateTime,
    /// How long past a CRL's next update it is still accepted.
    pub grace: Duration,
}

/// The outcome of successful SEV-SNP verification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedSnp {
    /// Product of the root the chain ends at.
    pub product: Product,
    /// VCEK or VLEK.
    pub signing_key: SigningKey,
    /// The chain ends at a simulated root.
    pub simulated: bool,
    /// REPORTED_TCB decoded for the product.
    pub reported_tcb: TcbClaims,
    /// Whether a CRL from the ARK was checked.
    pub crl_checked: bool,
    /// Signed timestamps seen (certificate and CRL issue times), for the clock floor.
    pub signed_timestamps: Vec<(OffsetDateTime, String)>,
    /// Each verification step that passed, as (check id, reason).
    pub passed: Vec<(&'static str, String)>,
}

struct Anchor {
    der: Vec<u8>,
    product: Option<Product>,
    simulated: bool,
    label: String,
}

fn builtin_anchors() -> (Vec<Anchor>, Vec<Vec<u8>>) {
    use sev::certs::snp::builtin::{genoa, milan, turin};
    let sets: [(Product, &[u8], &[u8]); 3] = [
        (Product::Milan, milan::ARK, milan::ASK),
        (Product::Genoa, genoa::ARK, genoa::ASK),
        (Product::Turin, turin::ARK, turin::ASK),
    ];
    let mut roots = Vec::new();
    let mut asks = Vec::new();
    for (product, ark, ask) in sets {
        // The sev crate's embedded PEMs are constants; a decoding failure would only drop a
        // root, which then fails verification closed.
        if let Ok(mut ders) = pki::pem_blocks(ark, "built-in ARK") {
            roots.push(Anchor {
                der: ders.remove(0),
                product: Some(product),
                simulated: false,
                label: format!("built-in AMD {} ARK", product.name()),
            });
        }
        if let Ok(ders) = pki::pem_blocks(ask, "built-in ASK") {
            asks.extend(ders);
        }
    }
    (roots, asks)
}

/// SHA-256 of the simulated TEE's test ARK (`testdata/sim/ark.der`): only to name simulated
/// evidence in the error when a policy does not trust it. The verifier never imports the
/// simulator (feature `simulated`); a test there keeps this value equal to its ARK's.
pub const SIMULATED_ARK_SHA256: &str =
    "fb21e12027a2a6c39ce6201369eff061e109ef34bfff4e728769be3c68aaa42d";

const OID_PRODUCT_NAME: &str = "1.3.6.1.4.1.3704.1.2";
const OID_BL_SPL: &str = "1.3.6.1.4.1.3704.1.3.1";
const OID_TEE_SPL: &str = "1.3.6.1.4.1.3704.1.3.2";
const OID_SNP_SPL: &str = "1.3.6.1.4.1.3704.1.3.3";
const OID_UCODE_SPL: &str = "1.3.6.1.4.1.3704.1.3.8";
const OID_FMC_SPL: &str = "1.3.6.1.4.1.3704.1.3.9";
const OID_HWID: &str = "1.3.6.1.4.1.3704.1.4";

fn extension<'a>(cert: &'a X509Certificate<'_>, oid: &str) -> Option<&'a [u8]> {
    cert.iter_extensions()
        .find(|e| e.oid.to_id_string() == oid)
        .map(|e| e.value)
}

fn extension_u8(cert: &X509Certificate<'_>, oid: &str, name: &str) -> Result<Option<u8>, String> {
    let Some(value) = extension(cert, oid) else {
        return Ok(None);
    };
    let (_, obj) = x509_parser::der_parser::der::parse_der_integer(value)
        .map_err(|e| format!("{name} extension is not an INTEGER: {e}"))?;
    let n = obj
        .as_u32()
        .map_err(|e| format!("{name} extension is not a small integer: {e}"))?;
    u8::try_from(n)
        .map(Some)
        .map_err(|_| format!("{name} extension value {n} exceeds 255"))
}

/// The product named by an endorsement key's productName extension (e.g. `Milan-B0`).
pub fn product_name(cert: &X509Certificate<'_>) -> Option<String> {
    let value = extension(cert, OID_PRODUCT_NAME)?;
    let (_, obj) = x509_parser::der_parser::der::parse_der(value).ok()?;
    obj.as_str().ok().map(str::to_owned)
}

/// The TCB an endorsement key certifies, from its SPL extensions.
pub fn certified_tcb(cert: &X509Certificate<'_>, product: Product) -> Result<TcbClaims, String> {
    let need = |oid: &str, name: &str| -> Result<u8, String> {
        extension_u8(cert, oid, name)?
            .ok_or_else(|| format!("endorsement key lacks the {name} extension"))
    };
    let fmc = if product.turin_tcb_layout() {
        Some(need(OID_FMC_SPL, "FMC SPL")?)
    } else {
        None
    };
    Ok(TcbClaims {
        fmc,
        bootloader: need(OID_BL_SPL, "bootloader SPL")?,
        tee: need(OID_TEE_SPL, "TEE SPL")?,
        snp: need(OID_SNP_SPL, "SNP SPL")?,
        microcode: need(OID_UCODE_SPL, "microcode SPL")?,
    })
}

/// The hwID a VCEK certifies: raw bytes (older VCEKs) or a DER OCTET STRING (newer ones);
/// 64 bytes on Milan and Genoa, 8 on Turin.
pub fn hw_id(cert: &X509Certificate<'_>) -> Option<Vec<u8>> {
    let value = extension(cert, OID_HWID)?;
    if matches!(value.len(), 8 | 64) {
        return Some(value.to_vec());
    }
    let (_, obj) = x509_parser::der_parser::der::parse_der_octetstring(value).ok()?;
    obj.as_slice().ok().map(<[u8]>::to_vec)
}

struct Chain {
    vek: Vec<u8>,
    intermediate: Vec<u8>,
    root_index: usize,
}

fn decode_all(list: &[crate::evidence::Base64Bytes]) -> impl Iterator<Item = Vec<u8>> + '_ {
    list.iter().map(|b| b.0.clone())
}

/// Verifies a report against the supplied certificates and trusted roots.
pub fn verify(
    report: &SnpReport,
    input: &SnpVerifyInput<'_>,
) -> Result<VerifiedSnp, SnpVerifyError> {
    let mut passed = Vec::new();
    let (vek_kind, vek_name) = match report.signing_key() {
        SigningKey::Vcek => (SnpCertKind::Vcek, "VCEK"),
        SigningKey::Vlek => (SnpCertKind::Vlek, "VLEK"),
        other => {
            return Err(SnpVerifyError::SigningKey(format!(
                "KEY_INFO signing key {other:?}"
            )));
        }
    };
    if report.signature_algo() != SIG_ALGO_ECDSA_P384_SHA384 {
        return Err(SnpVerifyError::SigningKey(format!(
            "signature algorithm {}",
            report.signature_algo()
        )));
    }

    let (mut roots, builtin_asks) = builtin_anchors();
    let mut candidate_roots: Vec<Vec<u8>> = input
        .certs
        .iter()
        .filter(|c| c.kind == SnpCertKind::Ark)
        .map(|c| c.der.0.clone())
        .collect();
    if let Some(amd) = input.collateral {
        candidate_roots.extend(decode_all(&amd.ark));
    }
    let offers_simulated_ark = candidate_roots
        .iter()
        .any(|der| hex::encode(pki::sha256(der)) == SIMULATED_ARK_SHA256);
    for der in candidate_roots {
        let fingerprint = hex::encode(pki::sha256(&der));
        if input.trusted_simulated_arks.contains(&fingerprint) {
            roots.push(Anchor {
                der,
                product: None,
                simulated: true,
                label: format!("simulated ARK {fingerprint} (trusted by policy)"),
            });
        }
    }

    let mut intermediates: Vec<Vec<u8>> = input
        .certs
        .iter()
        .filter(|c| matches!(c.kind, SnpCertKind::Ask | SnpCertKind::Asvk))
        .map(|c| c.der.0.clone())
        .collect();
    let mut veks: Vec<Vec<u8>> = input
        .certs
        .iter()
        .filter(|c| c.kind == vek_kind)
        .map(|c| c.der.0.clone())
        .collect();
    if let Some(amd) = input.collateral {
        intermediates.extend(decode_all(&amd.intermediates));
        match vek_kind {
            SnpCertKind::Vlek => veks.extend(decode_all(&amd.vlek)),
            _ => veks.extend(decode_all(&amd.vcek)),
        }
    }
    intermediates.extend(builtin_asks);
    if veks.is_empty() {
        return Err(SnpVerifyError::MissingEndorsementKey(vek_name));
    }

    // Find a chain VEK -> intermediate -> root whose VEK also signed the report.
    let mut chained_but_bad_signature = false;
    let mut parse_errors = Vec::new();
    let mut found = None;
    'search: for vek_der in &veks {
        let vek = match pki::parse_certificate(vek_der, vek_name) {
            Ok(c) => c,
            Err(e) => {
                parse_errors.push(e.to_string());
                continue;
            }
        };
        for inter_der in &intermediates {
            let Ok(inter) = pki::parse_certificate(inter_der, "intermediate") else {
                continue;
            };
            if pki::verify_issued_by(&vek, &inter, vek_name).is_err() {
                continue;
            }
            for (root_index, root) in roots.iter().enumerate() {
                let Ok(ark) = pki::parse_certificate(&root.der, "ARK") else {
                    continue;
                };
                if pki::verify_issued_by(&ark, &ark, "ARK").is_err()
                    || pki::verify_issued_by(&inter, &ark, "intermediate").is_err()
                {
                    continue;
                }
                if report_signature_ok(report, &vek) {
                    found = Some(Chain {
                        vek: vek_der.clone(),
                        intermediate: inter_der.clone(),
                        root_index,
                    });
                    break 'search;
                }
                chained_but_bad_signature = true;
            }
        }
    }
    let Some(chain) = found else {
        if chained_but_bad_signature {
            return Err(SnpVerifyError::Signature(vek_name));
        }
        let mut msg = format!(
            "no supplied {vek_name} chains to a trusted ARK ({} {vek_name} candidate(s), {} intermediate(s), {} root(s) tried)",
            veks.len(),
            intermediates.len(),
            roots.len()
        );
        if !parse_errors.is_empty() {
            msg.push_str(&format!("; unparsable: {}", parse_errors.join("; ")));
        }
        if offers_simulated_ark
            && !input
                .trusted_simulated_arks
                .iter()
                .any(|fp| fp == SIMULATED_ARK_SHA256)
        {
            msg.push_str(
                "; the evidence chains to the simulated TEE's test ARK, which this policy does not trust (simulated evidence)",
            );
        }
        return Err(SnpVerifyError::Chain(msg));
    };

    let root = &roots[chain.root_index];
    let vek = pki::parse_certificate(&chain.vek, vek_name).map_err(SnpVerifyError::Validity)?;
    let inter = pki::parse_certificate(&chain.intermediate, "intermediate")
        .map_err(SnpVerifyError::Validity)?;
    let ark = pki::parse_certificate(&root.der, "ARK").map_err(SnpVerifyError::Validity)?;
    let inter_name = if vek_kind == SnpCertKind::Vlek {
        "ASVK"
    } else {
        "ASK"
    };

    let product = match root.product {
        Some(p) => p,
        None => product_name(&vek)
            .as_deref()
            .and_then(Product::from_name)
            .ok_or_else(|| {
                SnpVerifyError::Chain(format!(
                    "simulated {vek_name} names no known product (productName extension)"
                ))
            })?,
    };
    passed.push((
        "snp.chain",
        format!(
            "{vek_name} → {inter_name} → ARK verifies to the {}",
            root.label
        ),
    ));
    passed.push((
        "snp.report_signature",
        format!(
            "ECDSA P-384/SHA-384 signature over bytes 0x000..0x2A0 verifies with the {vek_name}"
        ),
    ));

    for (cert, name) in [(&vek, vek_name), (&inter, inter_name), (&ark, "ARK")] {
        pki::check_validity(cert, input.now, name).map_err(SnpVerifyError::Validity)?;
    }
    passed.push((
        "snp.cert_validity",
        format!(
            "{vek_name}, {inter_name} and ARK are valid at {}",
            pki::rfc3339(input.now)
        ),
    ));
    let mut signed_timestamps = vec![
        (
            vek.validity().not_before.to_datetime(),
            format!("{vek_name} notBefore"),
        ),
        (
            inter.validity().not_before.to_datetime(),
            format!("{inter_name} notBefore"),
        ),
    ];

    let mut crl_checked = false;
    if let Some(amd) = input.collateral {
        for (i, crl_der) in amd.crl.iter().enumerate() {
            let name = format!("AMD CRL #{i}");
            let Ok(crl) = pki::parse_crl(&crl_der.0, &name) else {
                return Err(SnpVerifyError::Crl(PkiError::Der {
                    what: name,
                    reason: "unparsable CRL in collateral".into(),
                }));
            };
            if crl.issuer().as_raw() != ark.subject().as_raw() {
                continue;
            }
            let issued = pki::check_crl(
                &crl_der.0,
                &ark,
                &[
                    (inter_name, inter.raw_serial()),
                    (vek_name, vek.raw_serial()),
                ],
                input.grace,
                input.now,
                &name,
            )
            .map_err(SnpVerifyError::Crl)?;
            signed_timestamps.push((issued, format!("{name} thisUpdate")));
            crl_checked = true;
        }
    }
    if crl_checked {
        passed.push((
            "snp.crl",
            format!(
                "the ARK's CRL is current and revokes neither the {inter_name} nor the {vek_name}"
            ),
        ));
    }

    if let Some(cpuid_product) = report.product_from_cpuid()
        && cpuid_product != product
    {
        return Err(SnpVerifyError::Product(format!(
            "report CPUID names {} but the chain is {}'s",
            cpuid_product.name(),
            product.name()
        )));
    }
    passed.push((
        "snp.product",
        match report.cpuid() {
            Some((f, m)) => format!(
                "CPUID family {f:#x} model {m:#x} is {}, as the chain",
                product.name()
            ),
            None => format!(
                "version-2 report: product {} from the chain",
                product.name()
            ),
        },
    ));

    let reported_tcb = product.decode_tcb(report.reported_tcb_raw());
    let certified = certified_tcb(&vek, product).map_err(SnpVerifyError::TcbBinding)?;
    if certified != reported_tcb {
        return Err(SnpVerifyError::TcbBinding(format!(
            "{vek_name} certifies TCB {certified:?} but REPORTED_TCB is {reported_tcb:?}"
        )));
    }
    passed.push((
        "snp.tcb_binding",
        format!("{vek_name} SPL extensions equal REPORTED_TCB"),
    ));

    if vek_kind == SnpCertKind::Vcek {
        let chip_id = report.chip_id();
        let id = hw_id(&vek)
            .ok_or_else(|| SnpVerifyError::HwId("VCEK lacks a hwID extension".into()))?;
        let expected: &[u8] = if product == Product::Turin {
            &chip_id[..8]
        } else {
            &chip_id[..]
        };
        if id.len() != expected.len() || id != expected {
            return Err(SnpVerifyError::HwId(format!(
                "VCEK hwID {} does not equal CHIP_ID {}",
                hex::encode(&id),
                hex::encode(expected)
            )));
        }
        passed.push((
            "snp.hwid",
            format!("VCEK hwID equals CHIP_ID ({} bytes)", id.len()),
        ));
    }

    Ok(VerifiedSnp {
        product,
        signing_key: report.signing_key(),
        simulated: root.simulated,
        reported_tcb,
        crl_checked,
        signed_timestamps,
        passed,
    })
}

fn report_signature_ok(report: &SnpReport, vek: &X509Certificate<'_>) -> bool {
    let Some(sig) = report.signature_p1363() else {
        return false;
    };
    let key = ring::signature::UnparsedPublicKey::new(
        &ring::signature::ECDSA_P384_SHA384_FIXED,
        vek.public_key().subject_public_key.data.as_ref(),
    );
    key.verify(report.signed_bytes(), &sig).is_ok()
}
