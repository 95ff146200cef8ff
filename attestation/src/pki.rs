//! Shared X.509 and time helpers for every verifier in this crate: certificate and CRL parsing,
//! signature checks (RSA-PKCS#1, RSA-PSS, ECDSA P-256/P-384) through `ring`, validity against a
//! caller-supplied `now`, and the freshness rules for signed collateral.

use ring::signature::{self, UnparsedPublicKey, VerificationAlgorithm};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use x509_parser::certificate::X509Certificate;
use x509_parser::prelude::FromDer;
use x509_parser::revocation_list::CertificateRevocationList;
use x509_parser::time::ASN1Time;
use x509_parser::x509::{AlgorithmIdentifier, SubjectPublicKeyInfo};

/// Errors from certificate, CRL and time checks. `what` names the object checked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PkiError {
    /// The bytes are not a DER certificate or CRL.
    #[error("{what}: not valid DER: {reason}")]
    Der {
        /// The object.
        what: String,
        /// The parser's message.
        reason: String,
    },
    /// The bytes are not PEM, or hold no certificate.
    #[error("{what}: not valid PEM: {reason}")]
    Pem {
        /// The object.
        what: String,
        /// The parser's message.
        reason: String,
    },
    /// The signature or key algorithm is not one this crate accepts.
    #[error("{what}: unsupported algorithm {algorithm}")]
    UnsupportedAlgorithm {
        /// The object.
        what: String,
        /// The algorithm (OID or description).
        algorithm: String,
    },
    /// The signature does not verify.
    #[error("{what}: signature does not verify")]
    BadSignature {
        /// The object.
        what: String,
    },
    /// `now` is before the object's validity begins.
    #[error("{what}: not valid before {not_before} (now {now})")]
    NotYetValid {
        /// The object.
        what: String,
        /// Start of validity, RFC 3339.
        not_before: String,
        /// The time checked, RFC 3339.
        now: String,
    },
    /// `now` is after the object's validity (plus any grace) ended.
    #[error("{what}: expired at {not_after} (now {now})")]
    Expired {
        /// The object.
        what: String,
        /// End of validity (plus grace), RFC 3339.
        not_after: String,
        /// The time checked, RFC 3339.
        now: String,
    },
    /// `now` is earlier than a signed timestamp already seen: the clock was set back.
    #[error("clock rollback: now {now} is earlier than {what} signed at {signed_at}")]
    ClockRollback {
        /// The object carrying the newest timestamp.
        what: String,
        /// That timestamp, RFC 3339.
        signed_at: String,
        /// The time checked, RFC 3339.
        now: String,
    },
    /// A certificate is listed in a CRL.
    #[error("{what}: revoked by {crl}")]
    Revoked {
        /// The certificate.
        what: String,
        /// The CRL.
        crl: String,
    },
}

/// Formats a time as RFC 3339 for messages and reports.
pub fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| t.unix_timestamp().to_string())
}

fn asn1_to_datetime(t: ASN1Time) -> OffsetDateTime {
    t.to_datetime()
}

/// Parses one DER certificate, requiring no trailing bytes.
pub fn parse_certificate<'a>(der: &'a [u8], what: &str) -> Result<X509Certificate<'a>, PkiError> {
    parse_whole(der, what, "certificate")
}

/// Parses one DER CRL, requiring no trailing bytes.
pub fn parse_crl<'a>(der: &'a [u8], what: &str) -> Result<CertificateRevocationList<'a>, PkiError> {
    parse_whole(der, what, "CRL")
}

/// Parses one DER structure that must fill `der` exactly.
fn parse_whole<'a, T>(der: &'a [u8], what: &str, kind: &str) -> Result<T, PkiError>
where
    T: FromDer<'a, x509_parser::error::X509Error>,
{
    let (rest, parsed) = T::from_der(der).map_err(|e| PkiError::Der {
        what: what.to_owned(),
        reason: e.to_string(),
    })?;
    if !rest.is_empty() {
        return Err(PkiError::Der {
            what: what.to_owned(),
            reason: format!("{} trailing bytes after the {kind}", rest.len()),
        });
    }
    Ok(parsed)
}

/// Decodes every PEM block of a buffer into DER, in order.
pub fn pem_blocks(pem: &[u8], what: &str) -> Result<Vec<Vec<u8>>, PkiError> {
    let mut out = Vec::new();
    for block in x509_parser::pem::Pem::iter_from_buffer(pem) {
        let block = block.map_err(|e| PkiError::Pem {
            what: what.to_owned(),
            reason: e.to_string(),
        })?;
        out.push(block.contents);
    }
    if out.is_empty() {
        return Err(PkiError::Pem {
            what: what.to_owned(),
            reason: "no PEM block found".into(),
        });
    }
    Ok(out)
}

/// Returns the DER of a certificate given as DER or as a single PEM block.
pub fn certificate_der(bytes: &[u8], what: &str) -> Result<Vec<u8>, PkiError> {
    if bytes.starts_with(b"-----BEGIN") {
        let mut blocks = pem_blocks(bytes, what)?;
        if blocks.len() != 1 {
            return Err(PkiError::Pem {
                what: what.to_owned(),
                reason: format!("{} PEM blocks, expected one", blocks.len()),
            });
        }
        Ok(blocks.remove(0))
    } else {
        Ok(bytes.to_vec())
    }
}

/// SHA-256 of bytes.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

fn curve_of(spki: &SubjectPublicKeyInfo<'_>) -> Option<String> {
    spki.algorithm
        .parameters
        .as_ref()
        .and_then(|p| p.as_oid().ok())
        .map(|oid| oid.to_id_string())
}

const OID_RSA_PSS: &str = "1.2.840.113549.1.1.10";
const OID_SHA256_RSA: &str = "1.2.840.113549.1.1.11";
const OID_SHA384_RSA: &str = "1.2.840.113549.1.1.12";
const OID_SHA512_RSA: &str = "1.2.840.113549.1.1.13";
const OID_ECDSA_SHA256: &str = "1.2.840.10045.4.3.2";
const OID_ECDSA_SHA384: &str = "1.2.840.10045.4.3.3";
const OID_SHA256: &str = "2.16.840.1.101.3.4.2.1";
const OID_SHA384: &str = "2.16.840.1.101.3.4.2.2";
const OID_P256: &str = "1.2.840.10045.3.1.7";
const OID_P384: &str = "1.3.132.0.34";

fn ring_algorithm(
    alg: &AlgorithmIdentifier<'_>,
    key: &SubjectPublicKeyInfo<'_>,
    what: &str,
) -> Result<&'static dyn VerificationAlgorithm, PkiError> {
    let unsupported = |algorithm: String| PkiError::UnsupportedAlgorithm {
        what: what.to_owned(),
        algorithm,
    };
    let oid = alg.algorithm.to_id_string();
    match oid.as_str() {
        OID_SHA256_RSA => Ok(&signature::RSA_PKCS1_2048_8192_SHA256),
        OID_SHA384_RSA => Ok(&signature::RSA_PKCS1_2048_8192_SHA384),
        OID_SHA512_RSA => Ok(&signature::RSA_PKCS1_2048_8192_SHA512),
        OID_RSA_PSS => {
            let parsed = x509_parser::signature_algorithm::SignatureAlgorithm::try_from(alg)
                .map_err(|e| unsupported(format!("RSASSA-PSS with bad parameters: {e}")))?;
            let x509_parser::signature_algorithm::SignatureAlgorithm::RSASSA_PSS(params) = parsed
            else {
                return Err(unsupported(oid));
            };
            // ring verifies PSS with the salt length equal to the hash length, which is what
            // AMD (salt 48 with SHA-384) and common CAs use.
            match params.hash_algorithm_oid().to_id_string().as_str() {
                OID_SHA384 => Ok(&signature::RSA_PSS_2048_8192_SHA384),
                OID_SHA256 => Ok(&signature::RSA_PSS_2048_8192_SHA256),
                other => Err(unsupported(format!("RSASSA-PSS with hash {other}"))),
            }
        }
        OID_ECDSA_SHA256 | OID_ECDSA_SHA384 => {
            let curve = curve_of(key).unwrap_or_default();
            match (oid.as_str(), curve.as_str()) {
                (OID_ECDSA_SHA256, OID_P256) => Ok(&signature::ECDSA_P256_SHA256_ASN1),
                (OID_ECDSA_SHA384, OID_P256) => Ok(&signature::ECDSA_P256_SHA384_ASN1),
                (OID_ECDSA_SHA256, OID_P384) => Ok(&signature::ECDSA_P384_SHA256_ASN1),
                (OID_ECDSA_SHA384, OID_P384) => Ok(&signature::ECDSA_P384_SHA384_ASN1),
                _ => Err(unsupported(format!("{oid} on curve {curve}"))),
            }
        }
        _ => Err(unsupported(oid)),
    }
}

/// Verifies an X.509-style signature (`alg` as in a certificate or CRL) over `message` with
/// the key in `key`.
pub fn verify_signature(
    key: &SubjectPublicKeyInfo<'_>,
    alg: &AlgorithmIdentifier<'_>,
    message: &[u8],
    signature: &[u8],
    what: &str,
) -> Result<(), PkiError> {
    let algorithm = ring_algorithm(alg, key, what)?;
    UnparsedPublicKey::new(algorithm, key.subject_public_key.data.as_ref())
        .verify(message, signature)
        .map_err(|_| PkiError::BadSignature {
            what: what.to_owned(),
        })
}

/// Verifies that `issuer`'s key signed `subject`, and that the names chain.
pub fn verify_issued_by(
    subject: &X509Certificate<'_>,
    issuer: &X509Certificate<'_>,
    what: &str,
) -> Result<(), PkiError> {
    if subject.issuer().as_raw() != issuer.subject().as_raw() {
        return Err(PkiError::BadSignature {
            what: format!(
                "{what} (issuer name {} does not match signer subject {})",
                subject.issuer(),
                issuer.subject()
            ),
        });
    }
    verify_signature(
        issuer.public_key(),
        &subject.signature_algorithm,
        subject.tbs_certificate.as_ref(),
        subject.signature_value.data.as_ref(),
        what,
    )
}

/// Verifies that `issuer` signed `crl`.
pub fn verify_crl_signature(
    crl: &CertificateRevocationList<'_>,
    issuer: &X509Certificate<'_>,
    what: &str,
) -> Result<(), PkiError> {
    verify_signature(
        issuer.public_key(),
        &crl.signature_algorithm,
        crl.tbs_cert_list.as_ref(),
        crl.signature_value.data.as_ref(),
        what,
    )
}

/// Checks `now` against a certificate's notBefore and notAfter.
pub fn check_validity(
    cert: &X509Certificate<'_>,
    now: OffsetDateTime,
    what: &str,
) -> Result<(), PkiError> {
    let not_before = asn1_to_datetime(cert.validity().not_before);
    let not_after = asn1_to_datetime(cert.validity().not_after);
    if now < not_before {
        return Err(PkiError::NotYetValid {
            what: what.to_owned(),
            not_before: rfc3339(not_before),
            now: rfc3339(now),
        });
    }
    if now > not_after {
        return Err(PkiError::Expired {
            what: what.to_owned(),
            not_after: rfc3339(not_after),
            now: rfc3339(now),
        });
    }
    Ok(())
}

/// Checks that signed collateral issued at `issued` with `next_update` is usable at `now`:
/// not issued in the future, and not more than `grace` past its next update.
pub fn check_freshness(
    issued: OffsetDateTime,
    next_update: OffsetDateTime,
    grace: time::Duration,
    now: OffsetDateTime,
    what: &str,
) -> Result<(), PkiError> {
    if now < issued {
        return Err(PkiError::NotYetValid {
            what: what.to_owned(),
            not_before: rfc3339(issued),
            now: rfc3339(now),
        });
    }
    let deadline = next_update + grace;
    if now > deadline {
        return Err(PkiError::Expired {
            what: format!("{what} (next update {} + grace)", rfc3339(next_update)),
            not_after: rfc3339(deadline),
            now: rfc3339(now),
        });
    }
    Ok(())
}

/// Checks a CRL: signed by `issuer`, fresh at `now` within `grace`, and not listing `serials`.
pub fn check_crl(
    crl_der: &[u8],
    issuer: &X509Certificate<'_>,
    serials: &[(&str, &[u8])],
    grace: time::Duration,
    now: OffsetDateTime,
    what: &str,
) -> Result<OffsetDateTime, PkiError> {
    let crl = parse_crl(crl_der, what)?;
    verify_crl_signature(&crl, issuer, what)?;
    let issued = asn1_to_datetime(crl.last_update());
    let next = crl
        .next_update()
        .map(asn1_to_datetime)
        .ok_or_else(|| PkiError::Der {
            what: what.to_owned(),
            reason: "CRL has no nextUpdate".into(),
        })?;
    check_freshness(issued, next, grace, now, what)?;
    for revoked in crl.iter_revoked_certificates() {
        for (name, serial) in serials {
            if revoked.raw_serial() == *serial {
                return Err(PkiError::Revoked {
                    what: (*name).to_owned(),
                    crl: what.to_owned(),
                });
            }
        }
    }
    Ok(issued)
}

/// Tracks the newest signed timestamp seen, and rejects a `now` earlier than it.
#[derive(Debug, Clone, Default)]
pub struct ClockFloor {
    newest: Option<(OffsetDateTime, String)>,
}

impl ClockFloor {
    /// A floor from an externally remembered timestamp (e.g. the last audit checkpoint).
    pub fn starting_at(t: OffsetDateTime, what: impl Into<String>) -> Self {
        Self {
            newest: Some((t, what.into())),
        }
    }

    /// Records a signed timestamp.
    pub fn observe(&mut self, t: OffsetDateTime, what: impl Into<String>) {
        if self.newest.as_ref().is_none_or(|(n, _)| t > *n) {
            self.newest = Some((t, what.into()));
        }
    }

    /// Records a certificate's notBefore (its issuance time).
    pub fn observe_certificate(&mut self, cert: &X509Certificate<'_>, what: &str) {
        self.observe(asn1_to_datetime(cert.validity().not_before), what);
    }

    /// The newest timestamp seen, if any.
    pub fn newest(&self) -> Option<OffsetDateTime> {
        self.newest.as_ref().map(|(t, _)| *t)
    }

    /// Fails when `now` is earlier than the newest timestamp seen.
    pub fn check(&self, now: OffsetDateTime) -> Result<(), PkiError> {
        match &self.newest {
            Some((t, what)) if now < *t => Err(PkiError::ClockRollback {
                what: what.clone(),
                signed_at: rfc3339(*t),
                now: rfc3339(now),
            }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    fn sim(name: &str) -> Vec<u8> {
        std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("testdata/sim")
                .join(name),
        )
        .unwrap()
    }

    #[test]
    fn simulated_chain_verifies_and_swapped_does_not() {
        let (ark, ask, vcek) = (sim("ark.der"), sim("ask.der"), sim("vcek.der"));
        let ark = parse_certificate(&ark, "ark").unwrap();
        let ask = parse_certificate(&ask, "ask").unwrap();
        let vcek = parse_certificate(&vcek, "vcek").unwrap();
        verify_issued_by(&ark, &ark, "ark").unwrap();
        verify_issued_by(&ask, &ark, "ask").unwrap();
        verify_issued_by(&vcek, &ask, "vcek").unwrap();
        assert!(verify_issued_by(&vcek, &ark, "vcek").is_err());
        assert!(verify_issued_by(&ask, &ask, "ask").is_err());
    }

    #[test]
    fn validity_and_freshness_use_the_given_now() {
        let der = sim("vcek-expired.der");
        let cert = parse_certificate(&der, "vcek").unwrap();
        assert!(check_validity(&cert, datetime!(2020-06-01 0:00 UTC), "vcek").is_ok());
        assert!(matches!(
            check_validity(&cert, datetime!(2022-01-01 0:00 UTC), "vcek"),
            Err(PkiError::Expired { .. })
        ));
        assert!(matches!(
            check_validity(&cert, datetime!(2019-01-01 0:00 UTC), "vcek"),
            Err(PkiError::NotYetValid { .. })
        ));
        let issued = datetime!(2024-01-01 0:00 UTC);
        let next = datetime!(2024-02-01 0:00 UTC);
        let grace = time::Duration::days(7);
        assert!(
            check_freshness(issued, next, grace, datetime!(2024-02-05 0:00 UTC), "crl").is_ok()
        );
        assert!(
            check_freshness(issued, next, grace, datetime!(2024-02-09 0:00 UTC), "crl").is_err()
        );
        // Issued after `now`: refused, with no grace before the issue date.
        let early = datetime!(2023-12-31 23:59:59 UTC);
        assert!(matches!(
            check_freshness(issued, next, grace, early, "crl"),
            Err(PkiError::NotYetValid { .. })
        ));
    }

    #[test]
    fn clock_floor_rejects_rollback() {
        let mut floor = ClockFloor::default();
        floor.observe(datetime!(2024-01-01 0:00 UTC), "a");
        floor.observe(datetime!(2023-01-01 0:00 UTC), "b");
        assert_eq!(floor.newest(), Some(datetime!(2024-01-01 0:00 UTC)));
        assert!(floor.check(datetime!(2024-06-01 0:00 UTC)).is_ok());
        assert!(matches!(
            floor.check(datetime!(2023-06-01 0:00 UTC)),
            Err(PkiError::ClockRollback { .. })
        ));
    }

    #[test]
    fn garbage_and_trailing_bytes_are_rejected() {
        assert!(parse_certificate(b"\x30\x03abc", "x").is_err());
        let mut der = sim("ark.der");
        der.push(0);
        assert!(parse_certificate(&der, "ark").is_err());
        assert!(pem_blocks(b"nothing", "x").is_err());
    }
}
