//! What a server certificate carries: the start-up evidence in its extension under
//! [`EVIDENCE_EXTENSION_OID`], and the SubjectPublicKeyInfo that evidence must bind.

use inferno_attestation::evidence::Evidence;
use inferno_attestation::runtime_data::{EVIDENCE_EXTENSION_OID, EVIDENCE_EXTENSION_OID_DER};
use sha2::{Digest, Sha256};
use x509_parser::prelude::{FromDer, X509Certificate};

/// The parts of a server certificate a client checks.
#[derive(Debug, Clone)]
pub struct CertificateClaims {
    /// SHA-256 of the DER SubjectPublicKeyInfo, lowercase hex.
    pub spki_sha256: String,
    /// The start-up evidence from the extension, or why it could not be read.
    pub evidence: Result<Evidence, String>,
}

/// Reads a DER certificate's public-key hash and evidence extension.
pub fn read_certificate(der: &[u8]) -> Result<CertificateClaims, String> {
    let (rest, cert) = X509Certificate::from_der(der)
        .map_err(|e| format!("the server certificate is not DER X.509: {e}"))?;
    if !rest.is_empty() {
        return Err("the server certificate has trailing bytes".to_owned());
    }
    let spki_sha256 = hex::encode(Sha256::digest(cert.public_key().raw));
    let mut found = cert
        .extensions()
        .iter()
        .filter(|ext| ext.oid.as_bytes() == EVIDENCE_EXTENSION_OID_DER);
    let evidence = match (found.next(), found.next()) {
        (None, _) => Err(format!(
            "the certificate has no evidence extension ({EVIDENCE_EXTENSION_OID})"
        )),
        (Some(_), Some(_)) => Err(format!(
            "the certificate has the evidence extension ({EVIDENCE_EXTENSION_OID}) twice"
        )),
        (Some(ext), None) => extension_evidence(ext.value),
    };
    Ok(CertificateClaims {
        spki_sha256,
        evidence,
    })
}

/// The extension's `extnValue` content octets are the evidence envelope's compact JSON, with no
/// inner DER wrapping (`docs/attestation-protocol.md`, section 2).
fn extension_evidence(value: &[u8]) -> Result<Evidence, String> {
    Evidence::from_bytes(value).map_err(|e| format!("the evidence extension: {e}"))
}
