//! AK certificates: an X.509 certificate that a cloud provider's CA issued for the AK (as on
//! GCE), checked to certify exactly this AK and to chain to a trusted root at `now`.

use serde::Serialize;
use time::OffsetDateTime;
use x509_parser::certificate::X509Certificate;

use super::abi::AkKey;
use super::error::TpmError;
use crate::pki;

/// Longest chain walked above the AK certificate.
const MAX_DEPTH: usize = 8;

/// A verified AK certificate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AkCertClaims {
    /// Subject of the AK certificate (may be empty, as on GCE).
    pub subject: String,
    /// Issuers from the AK certificate's issuer up to the trusted root.
    pub chain: Vec<String>,
}

/// Verifies that `cert_der` certifies `ak` and chains through `intermediates` (any order)
/// to one of `roots`, every certificate being valid at `now`.
pub fn verify_ak_certificate(
    ak: &AkKey,
    cert_der: &[u8],
    intermediates: &[Vec<u8>],
    roots: &[Vec<u8>],
    now: OffsetDateTime,
) -> Result<AkCertClaims, TpmError> {
    let fail = |e: pki::PkiError| TpmError::AkCertificate(e.to_string());
    let leaf = pki::parse_certificate(cert_der, "AK certificate").map_err(fail)?;
    let cert_key = AkKey::from_spki_der(leaf.public_key().raw)?;
    if cert_key.spki_sha256()? != ak.spki_sha256()? {
        return Err(TpmError::AkCertificate(
            "the certificate's public key is not the AK".into(),
        ));
    }
    if is_ca(&leaf) {
        return Err(TpmError::AkCertificate(
            "the AK certificate is a CA certificate".into(),
        ));
    }
    pki::check_validity(&leaf, now, "AK certificate").map_err(fail)?;
    let parsed_intermediates = intermediates
        .iter()
        .map(|der| pki::parse_certificate(der, "AK CA intermediate"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(fail)?;
    let parsed_roots = roots
        .iter()
        .map(|der| pki::parse_certificate(der, "AK CA root"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(fail)?;
    let mut chain = Vec::new();
    let mut current = leaf.clone();
    for _ in 0..MAX_DEPTH {
        if let Some(root) = parsed_roots
            .iter()
            .find(|r| pki::verify_issued_by(&current, r, "AK chain").is_ok())
        {
            pki::check_validity(root, now, "AK CA root").map_err(fail)?;
            chain.push(root.subject().to_string());
            return Ok(AkCertClaims {
                subject: leaf.subject().to_string(),
                chain,
            });
        }
        let issuer = parsed_intermediates
            .iter()
            .find(|i| pki::verify_issued_by(&current, i, "AK chain").is_ok())
            .ok_or_else(|| {
                TpmError::AkCertificate(format!(
                    "no trusted root or intermediate issued {}",
                    if chain.is_empty() {
                        "the AK certificate".to_string()
                    } else {
                        current.subject().to_string()
                    }
                ))
            })?;
        if !is_ca(issuer) {
            return Err(TpmError::AkCertificate(format!(
                "{} is not a CA",
                issuer.subject()
            )));
        }
        pki::check_validity(issuer, now, "AK CA intermediate").map_err(fail)?;
        chain.push(issuer.subject().to_string());
        current = issuer.clone();
    }
    Err(TpmError::AkCertificate(format!(
        "no trusted root within {MAX_DEPTH} certificates"
    )))
}

/// Whether the certificate says it is a CA.
fn is_ca(cert: &X509Certificate<'_>) -> bool {
    matches!(cert.basic_constraints(), Ok(Some(bc)) if bc.value.ca)
}
