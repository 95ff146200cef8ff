//! Attestation-key decoding (TPMT_PUBLIC, SubjectPublicKeyInfo DER, JWK) and quote
//! signature verification.

use rsa::pkcs8::EncodePublicKey as _;
use x509_cert::der::Encode as _;
use x509_cert::der::asn1::{BitString, ObjectIdentifier};
use x509_cert::spki::{AlgorithmIdentifierOwned, SubjectPublicKeyInfoOwned};
use x509_parser::prelude::FromDer as _;
use x509_parser::public_key::PublicKey;
use x509_parser::x509::SubjectPublicKeyInfo;

use super::abi::{AkKey, Signature};
use super::alg::HashAlg;
use super::error::TpmError;

/// id-ecPublicKey.
const OID_EC_PUBLIC_KEY: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
/// prime256v1 (NIST P-256).
const OID_P256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.3.1.7");

impl AkKey {
    /// Decodes a DER SubjectPublicKeyInfo holding an RSA or P-256 key.
    pub fn from_spki_der(der: &[u8]) -> Result<Self, TpmError> {
        let (rest, spki) = SubjectPublicKeyInfo::from_der(der)
            .map_err(|e| TpmError::AkKey(format!("invalid SubjectPublicKeyInfo: {e}")))?;
        if !rest.is_empty() {
            return Err(TpmError::AkKey(format!(
                "{} trailing bytes after SubjectPublicKeyInfo",
                rest.len()
            )));
        }
        match spki
            .parsed()
            .map_err(|e| TpmError::AkKey(format!("undecodable public key: {e}")))?
        {
            PublicKey::RSA(rsa) => {
                let exponent = rsa
                    .try_exponent()
                    .ok()
                    .and_then(|e| u32::try_from(e).ok())
                    .ok_or_else(|| TpmError::AkKey("RSA exponent does not fit 32 bits".into()))?;
                Ok(Self::Rsa {
                    modulus: strip_leading_zeros(rsa.modulus).to_vec(),
                    exponent,
                })
            }
            PublicKey::EC(point) => {
                let curve = spki
                    .algorithm
                    .parameters
                    .as_ref()
                    .and_then(|p| p.as_oid().ok())
                    .map(|oid| oid.to_id_string());
                if curve.as_deref() != Some("1.2.840.10045.3.1.7") {
                    return Err(TpmError::AkKey(format!(
                        "EC key on curve {curve:?}; only P-256 is supported"
                    )));
                }
                let raw = point.data();
                if raw.len() != 65 || raw[0] != 0x04 {
                    return Err(TpmError::AkKey(
                        "EC point is not an uncompressed P-256 point".into(),
                    ));
                }
                Ok(Self::EccP256 {
                    x: raw[1..33].to_vec(),
                    y: raw[33..].to_vec(),
                })
            }
            _ => Err(TpmError::AkKey("unsupported key type".into())),
        }
    }

    /// Encodes the key as a DER SubjectPublicKeyInfo (the form whose SHA-256 is the AK hash).
    pub fn to_spki_der(&self) -> Result<Vec<u8>, TpmError> {
        match self {
            Self::Rsa { modulus, exponent } => {
                let key = rsa::RsaPublicKey::new(
                    rsa::BigUint::from_bytes_be(modulus),
                    rsa::BigUint::from(*exponent),
                )
                .map_err(|e| TpmError::AkKey(format!("invalid RSA key: {e}")))?;
                key.to_public_key_der()
                    .map(|d| d.as_bytes().to_vec())
                    .map_err(|e| TpmError::AkKey(format!("RSA key encoding: {e}")))
            }
            Self::EccP256 { .. } => {
                let point = self.p256_point()?;
                let params = x509_cert::der::Any::from(OID_P256);
                let spki = SubjectPublicKeyInfoOwned {
                    algorithm: AlgorithmIdentifierOwned {
                        oid: OID_EC_PUBLIC_KEY,
                        parameters: Some(params),
                    },
                    subject_public_key: BitString::from_bytes(&point)
                        .map_err(|e| TpmError::AkKey(format!("EC point encoding: {e}")))?,
                };
                spki.to_der()
                    .map_err(|e| TpmError::AkKey(format!("EC key encoding: {e}")))
            }
        }
    }

    /// SHA-256 of [`AkKey::to_spki_der`]: the AK hash bound into the runtime-data document.
    pub fn spki_sha256(&self) -> Result<[u8; 32], TpmError> {
        let der = self.to_spki_der()?;
        let digest = HashAlg::Sha256.digest(&der);
        let mut out = [0u8; 32];
        out.copy_from_slice(&digest);
        Ok(out)
    }

    /// Uncompressed SEC1 point (0x04 || x || y) with coordinates padded to 32 bytes.
    fn p256_point(&self) -> Result<Vec<u8>, TpmError> {
        let Self::EccP256 { x, y } = self else {
            return Err(TpmError::AkKey("not an ECC key".into()));
        };
        let mut point = vec![0x04];
        point.extend_from_slice(&left_pad(x, 32)?);
        point.extend_from_slice(&left_pad(y, 32)?);
        Ok(point)
    }

    /// Verifies `sig` over `message` (a marshalled TPMS_ATTEST). Quote `index` names errors.
    pub fn verify(&self, message: &[u8], sig: &Signature, index: usize) -> Result<(), TpmError> {
        use ring::signature as rs;
        let ok = match (self, sig) {
            (Self::Rsa { modulus, exponent }, Signature::RsaSsa { hash, sig }) => {
                let alg: &rs::RsaParameters = match hash {
                    HashAlg::Sha1 => &rs::RSA_PKCS1_2048_8192_SHA1_FOR_LEGACY_USE_ONLY,
                    HashAlg::Sha256 => &rs::RSA_PKCS1_2048_8192_SHA256,
                    HashAlg::Sha384 => &rs::RSA_PKCS1_2048_8192_SHA384,
                };
                let e = exponent.to_be_bytes();
                rs::RsaPublicKeyComponents {
                    n: modulus.as_slice(),
                    e: strip_leading_zeros(&e),
                }
                .verify(alg, message, sig)
                .is_ok()
            }
            (Self::EccP256 { .. }, Signature::Ecdsa { hash, r, s }) => {
                if *hash != HashAlg::Sha256 {
                    return Err(TpmError::Unsupported {
                        structure: "TPMT_SIGNATURE",
                        field: "hash (ECDSA P-256 supports only SHA-256)",
                        value: u64::from(hash.tpm_alg()),
                    });
                }
                let mut fixed = left_pad(r, 32)?;
                fixed.extend_from_slice(&left_pad(s, 32)?);
                rs::UnparsedPublicKey::new(&rs::ECDSA_P256_SHA256_FIXED, self.p256_point()?)
                    .verify(message, &fixed)
                    .is_ok()
            }
            (_, Signature::RsaSsa { .. }) => {
                return Err(TpmError::SignatureKeyMismatch {
                    index,
                    sig_alg: super::alg::ALG_RSASSA,
                });
            }
            (_, Signature::Ecdsa { .. }) => {
                return Err(TpmError::SignatureKeyMismatch {
                    index,
                    sig_alg: super::alg::ALG_ECDSA,
                });
            }
        };
        if ok {
            Ok(())
        } else {
            Err(TpmError::BadSignature { index })
        }
    }
}

/// Drops leading zero bytes of a big-endian integer.
fn strip_leading_zeros(bytes: &[u8]) -> &[u8] {
    let first = bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len());
    &bytes[first..]
}

/// Left-pads a big-endian integer to `len` bytes.
fn left_pad(bytes: &[u8], len: usize) -> Result<Vec<u8>, TpmError> {
    let trimmed = strip_leading_zeros(bytes);
    if trimmed.len() > len {
        return Err(TpmError::AkKey(format!(
            "integer of {} bytes exceeds {len}",
            trimmed.len()
        )));
    }
    let mut out = vec![0u8; len - trimmed.len()];
    out.extend_from_slice(trimmed);
    Ok(out)
}
