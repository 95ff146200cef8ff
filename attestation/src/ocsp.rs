//! Offline OCSP (RFC 6960): the status of a certificate from DER OCSP responses that a
//! connected machine fetched into the collateral bundle.
//!
//! For a certificate and its issuer, [`OcspResponses::status`] finds the single responses
//! whose CertID names that certificate (issuer name hash, issuer key hash, serial number, with
//! the hash algorithm the response chose), takes the newest, and checks that:
//! - the response is signed by the issuer itself, or by a delegated responder whose certificate
//!   is in the response, is issued by that issuer, carries the `id-kp-OCSPSigning` extended key
//!   usage and is valid at `now`;
//! - the status is good (revoked is refused with its time and reason, unknown likewise);
//! - thisUpdate is not after `now`, and `now` is at most `grace` past nextUpdate (a response
//!   without nextUpdate is usable for `grace` after its thisUpdate).
//!
//! ASN.1 comes from RustCrypto's `x509-ocsp`; signatures are checked by [`crate::pki`].

use der::{Decode as _, Encode as _};
use time::OffsetDateTime;
use x509_ocsp::{BasicOcspResponse, CertStatus, OcspResponse, OcspResponseStatus, ResponderId};
use x509_parser::certificate::X509Certificate;
use x509_parser::prelude::FromDer as _;
use x509_parser::x509::AlgorithmIdentifier;

use crate::pki::{self, PkiError};

/// id-pkix-ocsp-basic: the only response type this verifier reads.
const OID_OCSP_BASIC: &str = "1.3.6.1.5.5.7.48.1.1";
/// CertID hash algorithms.
const OID_SHA1: &str = "1.3.14.3.2.26";
const OID_SHA256: &str = "2.16.840.1.101.3.4.2.1";
const OID_SHA384: &str = "2.16.840.1.101.3.4.2.2";
const OID_SHA512: &str = "2.16.840.1.101.3.4.2.3";

/// Why a certificate's OCSP status is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OcspError {
    /// A bundled response is not DER OCSP.
    #[error("OCSP response {name}: {reason}")]
    Malformed {
        /// The response's name in the bundle.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// No bundled response names the certificate.
    #[error("{what}: no OCSP response in the collateral names it (serial {serial})")]
    Missing {
        /// The certificate.
        what: String,
        /// Its serial number, hex.
        serial: String,
    },
    /// The response is not signed by the issuer or a delegated responder of it.
    #[error(
        "{what}: OCSP response {name} is not signed by the issuer or its delegated responder: {reason}"
    )]
    Signer {
        /// The certificate.
        what: String,
        /// The response's name.
        name: String,
        /// What failed.
        reason: String,
    },
    /// The responder says the certificate is revoked.
    #[error("{what}: revoked at {time} (reason: {reason}) according to OCSP response {name}")]
    Revoked {
        /// The certificate.
        what: String,
        /// The response's name.
        name: String,
        /// The revocation time, RFC 3339.
        time: String,
        /// The CRL reason, or `unspecified`.
        reason: String,
    },
    /// The responder does not know the certificate.
    #[error("{what}: status unknown according to OCSP response {name}")]
    Unknown {
        /// The certificate.
        what: String,
        /// The response's name.
        name: String,
    },
    /// A certificate is malformed, or the response is not yet valid or is stale at `now`.
    #[error("{0}")]
    Pki(PkiError),
}

/// A good status: what the appraisal reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OcspGood {
    /// The response's name in the bundle.
    pub name: String,
    /// The responder: the issuer itself, or the delegated responder's subject.
    pub responder: String,
    /// thisUpdate, RFC 3339.
    pub this_update: String,
    /// nextUpdate, RFC 3339, when the response has one.
    pub next_update: Option<String>,
}

/// One parsed response.
#[derive(Debug)]
struct Parsed {
    name: String,
    basic: BasicOcspResponse,
}

/// The bundle's OCSP responses, parsed.
#[derive(Debug, Default)]
pub struct OcspResponses {
    responses: Vec<Parsed>,
}

impl OcspResponses {
    /// Parses `(name, DER)` responses; any that is malformed or not successful is an error
    /// naming it.
    pub fn parse<'a>(
        blobs: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    ) -> Result<Self, OcspError> {
        let responses = blobs
            .into_iter()
            .map(|(name, der)| {
                parse_one(name, der).map(|basic| Parsed {
                    name: name.to_owned(),
                    basic,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { responses })
    }

    /// Whether there are no responses.
    pub fn is_empty(&self) -> bool {
        self.responses.is_empty()
    }

    /// The status of `cert` (issued by `issuer`) at `now`, allowing `grace` past nextUpdate.
    /// `what` names the certificate in errors.
    pub fn status(
        &self,
        cert: &X509Certificate<'_>,
        issuer: &X509Certificate<'_>,
        now: OffsetDateTime,
        grace: time::Duration,
        what: &str,
    ) -> Result<OcspGood, OcspError> {
        let mut matches = Vec::new();
        for parsed in &self.responses {
            for single in &parsed.basic.tbs_response_data.responses {
                if cert_id_matches(&single.cert_id, cert, issuer) {
                    matches.push((parsed, single));
                }
            }
        }
        let Some((parsed, single)) = matches
            .into_iter()
            .max_by_key(|(_, single)| single.this_update.0.to_unix_duration())
        else {
            return Err(OcspError::Missing {
                what: what.to_owned(),
                serial: hex::encode(cert.raw_serial()),
            });
        };
        let responder =
            verify_response_signature(&parsed.basic, issuer, now).map_err(|reason| {
                OcspError::Signer {
                    what: what.to_owned(),
                    name: parsed.name.clone(),
                    reason,
                }
            })?;
        match &single.cert_status {
            CertStatus::Good(_) => {}
            CertStatus::Revoked(info) => {
                return Err(OcspError::Revoked {
                    what: what.to_owned(),
                    name: parsed.name.clone(),
                    time: pki::rfc3339(to_time(&info.revocation_time.0)),
                    reason: info
                        .revocation_reason
                        .map_or_else(|| "unspecified".to_owned(), |r| format!("{r:?}")),
                });
            }
            CertStatus::Unknown(_) => {
                return Err(OcspError::Unknown {
                    what: what.to_owned(),
                    name: parsed.name.clone(),
                });
            }
        }
        let this_update = to_time(&single.this_update.0);
        let next_update = single.next_update.as_ref().map(|t| to_time(&t.0));
        let label = format!("{what}: OCSP response {}", parsed.name);
        pki::check_freshness(
            this_update,
            next_update.unwrap_or(this_update),
            grace,
            now,
            &label,
        )
        .map_err(OcspError::Pki)?;
        Ok(OcspGood {
            name: parsed.name.clone(),
            responder,
            this_update: pki::rfc3339(this_update),
            next_update: next_update.map(pki::rfc3339),
        })
    }
}

/// Decodes an OCSPResponse and its BasicOCSPResponse.
fn parse_one(name: &str, der: &[u8]) -> Result<BasicOcspResponse, OcspError> {
    let bad = |reason: String| OcspError::Malformed {
        name: name.to_owned(),
        reason,
    };
    let response = OcspResponse::from_der(der).map_err(|e| bad(format!("not DER OCSP: {e}")))?;
    if response.response_status != OcspResponseStatus::Successful {
        return Err(bad(format!(
            "response status {:?}, not successful",
            response.response_status
        )));
    }
    let bytes = response
        .response_bytes
        .ok_or_else(|| bad("a successful response without responseBytes".into()))?;
    if bytes.response_type.to_string() != OID_OCSP_BASIC {
        return Err(bad(format!(
            "response type {} is not id-pkix-ocsp-basic",
            bytes.response_type
        )));
    }
    BasicOcspResponse::from_der(bytes.response.as_bytes())
        .map_err(|e| bad(format!("BasicOCSPResponse: {e}")))
}

/// Hashes `data` with the CertID hash algorithm `oid`.
fn digest(oid: &str, data: &[u8]) -> Option<Vec<u8>> {
    let algorithm = match oid {
        OID_SHA1 => &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
        OID_SHA256 => &ring::digest::SHA256,
        OID_SHA384 => &ring::digest::SHA384,
        OID_SHA512 => &ring::digest::SHA512,
        _ => return None,
    };
    Some(ring::digest::digest(algorithm, data).as_ref().to_vec())
}

/// Whether `id` names `cert` issued by `issuer`.
fn cert_id_matches(
    id: &x509_ocsp::CertId,
    cert: &X509Certificate<'_>,
    issuer: &X509Certificate<'_>,
) -> bool {
    let oid = id.hash_algorithm.oid.to_string();
    let name_hash = digest(&oid, issuer.subject().as_raw());
    let key_hash = digest(&oid, &issuer.public_key().subject_public_key.data);
    id.serial_number.as_bytes() == cert.raw_serial()
        && name_hash.as_deref() == Some(id.issuer_name_hash.as_bytes())
        && key_hash.as_deref() == Some(id.issuer_key_hash.as_bytes())
}

/// Whether the ResponderID names `cert`.
fn responder_is(id: &ResponderId, cert: &X509Certificate<'_>) -> bool {
    match id {
        ResponderId::ByName(name) => name
            .to_der()
            .is_ok_and(|der| der.as_slice() == cert.subject().as_raw()),
        ResponderId::ByKey(hash) => {
            digest(OID_SHA1, &cert.public_key().subject_public_key.data).as_deref()
                == Some(hash.as_bytes())
        }
    }
}

/// Verifies the response's signature by `issuer` or a delegated responder; returns who signed.
fn verify_response_signature(
    basic: &BasicOcspResponse,
    issuer: &X509Certificate<'_>,
    now: OffsetDateTime,
) -> Result<String, String> {
    let tbs = basic
        .tbs_response_data
        .to_der()
        .map_err(|e| format!("cannot encode ResponseData: {e}"))?;
    let alg_der = basic
        .signature_algorithm
        .to_der()
        .map_err(|e| format!("cannot encode the signature algorithm: {e}"))?;
    let (_, alg) =
        AlgorithmIdentifier::from_der(&alg_der).map_err(|e| format!("signature algorithm: {e}"))?;
    let signature = basic.signature.raw_bytes();
    let responder_id = &basic.tbs_response_data.responder_id;
    if responder_is(responder_id, issuer) {
        pki::verify_signature(issuer.public_key(), &alg, &tbs, signature, "OCSP response")
            .map_err(|e| e.to_string())?;
        return Ok(format!("the issuer ({})", issuer.subject()));
    }
    let delegated = basic
        .certs
        .iter()
        .flatten()
        .map(|c| {
            c.to_der()
                .map_err(|e| format!("responder certificate: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    for der in &delegated {
        let responder =
            pki::parse_certificate(der, "OCSP responder certificate").map_err(|e| e.to_string())?;
        if !responder_is(responder_id, &responder) {
            continue;
        }
        check_delegated(&responder, issuer, now)?;
        pki::verify_signature(
            responder.public_key(),
            &alg,
            &tbs,
            signature,
            "OCSP response",
        )
        .map_err(|e| e.to_string())?;
        return Ok(format!("delegated responder {}", responder.subject()));
    }
    Err("the responder ID names neither the issuer nor a certificate in the response".into())
}

/// A delegated responder: issued by `issuer`, `id-kp-OCSPSigning`, valid at `now`.
fn check_delegated(
    responder: &X509Certificate<'_>,
    issuer: &X509Certificate<'_>,
    now: OffsetDateTime,
) -> Result<(), String> {
    let what = format!("delegated OCSP responder {}", responder.subject());
    pki::verify_issued_by(responder, issuer, &what).map_err(|e| e.to_string())?;
    let ocsp_signing = matches!(
        responder.extended_key_usage(),
        Ok(Some(eku)) if eku.value.ocsp_signing
    );
    if !ocsp_signing {
        return Err(format!(
            "{what} lacks the id-kp-OCSPSigning extended key usage"
        ));
    }
    pki::check_validity(responder, now, &what).map_err(|e| e.to_string())
}

/// Converts an ASN.1 GeneralizedTime.
fn to_time(t: &der::asn1::GeneralizedTime) -> OffsetDateTime {
    let secs = i64::try_from(t.to_unix_duration().as_secs()).unwrap_or(i64::MAX);
    OffsetDateTime::from_unix_timestamp(secs).unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

/// The OCSP outcome for one certificate of a chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertOcsp {
    /// The certificate, e.g. `GPU device chain certificate 1 (CN=...)`.
    pub what: String,
    /// Its status.
    pub status: Result<OcspGood, OcspError>,
}

/// Checks the OCSP status of every certificate in `chain` (DER, leaf first, each issued by the
/// next) from index `first` up to, but not including, the last (the root, or the certificate
/// a trusted root issued, whose issuer is not in the chain). Fails only when a certificate
/// cannot be parsed; each certificate's own outcome is in its [`CertOcsp`].
pub fn check_chain(
    responses: &OcspResponses,
    chain: &[Vec<u8>],
    first: usize,
    now: OffsetDateTime,
    grace: time::Duration,
    chain_name: &str,
) -> Result<Vec<CertOcsp>, OcspError> {
    let certs = chain
        .iter()
        .enumerate()
        .map(|(i, der)| {
            pki::parse_certificate(der, &format!("{chain_name} certificate {i}"))
                .map_err(OcspError::Pki)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(certs
        .windows(2)
        .enumerate()
        .skip(first)
        .map(|(i, pair)| {
            let what = format!("{chain_name} certificate {i} ({})", pair[0].subject());
            let status = responses.status(&pair[0], &pair[1], now, grace, &what);
            CertOcsp { what, status }
        })
        .collect())
}
