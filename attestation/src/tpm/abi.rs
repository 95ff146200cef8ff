//! Parsing of the TPM 2.0 structures in a quote: TPMS_ATTEST, TPMT_SIGNATURE and TPMT_PUBLIC.
//!
//! Layouts follow TPM 2.0 Library Part 2 (Structures). No policy here: only bytes to fields.

use super::alg::{ALG_ECC, ALG_ECDSA, ALG_NULL, ALG_RSA, ALG_RSASSA, ECC_NIST_P256, HashAlg};
use super::error::TpmError;
use super::reader::Reader;

/// TPM_GENERATED_VALUE, the magic of every TPMS_ATTEST produced by a TPM.
const TPM_GENERATED_VALUE: u32 = 0xff54_4347;
/// TPM_ST_ATTEST_QUOTE.
const TPM_ST_ATTEST_QUOTE: u16 = 0x8018;
/// Largest PCR bitmap accepted (32 PCRs; PC Client TPMs have 24).
const MAX_PCR_SELECT: u8 = 4;

/// One TPMS_PCR_SELECTION: a bank and the PCR indices it selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PcrSelection {
    /// The bank's hash algorithm.
    pub bank: HashAlg,
    /// Selected PCR indices, ascending.
    pub pcrs: Vec<u8>,
}

/// A decoded TPMS_ATTEST of type TPM_ST_ATTEST_QUOTE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quote {
    /// Name of the signing key (nameAlg || digest of its TPMT_PUBLIC).
    pub qualified_signer: Vec<u8>,
    /// Caller-supplied qualifying data (the nonce).
    pub extra_data: Vec<u8>,
    /// TPMS_CLOCK_INFO.clock.
    pub clock: u64,
    /// TPMS_CLOCK_INFO.resetCount.
    pub reset_count: u32,
    /// TPMS_CLOCK_INFO.restartCount.
    pub restart_count: u32,
    /// Firmware version of the TPM.
    pub firmware_version: u64,
    /// The PCR selection that was quoted.
    pub selections: Vec<PcrSelection>,
    /// Digest over the selected PCR values, with the signing scheme's hash.
    pub pcr_digest: Vec<u8>,
}

impl Quote {
    /// Parses a marshalled TPMS_ATTEST that must be a quote.
    pub fn parse(bytes: &[u8]) -> Result<Self, TpmError> {
        const S: &str = "TPMS_ATTEST";
        let mut r = Reader::new(bytes, S);
        let magic = r.u32("magic")?;
        if magic != TPM_GENERATED_VALUE {
            return Err(TpmError::NotTpmGenerated(magic));
        }
        let kind = r.u16("type")?;
        if kind != TPM_ST_ATTEST_QUOTE {
            return Err(TpmError::NotAQuote(kind));
        }
        let qualified_signer = r.tpm2b("qualifiedSigner")?.to_vec();
        let extra_data = r.tpm2b("extraData")?.to_vec();
        let clock = r.u64("clockInfo.clock")?;
        let reset_count = r.u32("clockInfo.resetCount")?;
        let restart_count = r.u32("clockInfo.restartCount")?;
        let _safe = r.u8("clockInfo.safe")?;
        let firmware_version = r.u64("firmwareVersion")?;
        let count = r.u32("attested.quote.pcrSelect.count")?;
        let mut selections = Vec::new();
        for _ in 0..count {
            let alg = r.u16("pcrSelections.hash")?;
            let bank = HashAlg::from_tpm_alg(alg).ok_or(TpmError::Unsupported {
                structure: S,
                field: "pcrSelections.hash",
                value: u64::from(alg),
            })?;
            let size = r.u8("pcrSelections.sizeofSelect")?;
            if size > MAX_PCR_SELECT {
                return Err(TpmError::Unsupported {
                    structure: S,
                    field: "pcrSelections.sizeofSelect",
                    value: u64::from(size),
                });
            }
            let bitmap = r.bytes(usize::from(size), "pcrSelections.pcrSelect")?;
            let pcrs = (0..size * 8)
                .filter(|pcr| bitmap[usize::from(pcr / 8)] & (1 << (pcr % 8)) != 0)
                .collect();
            selections.push(PcrSelection { bank, pcrs });
        }
        let pcr_digest = r.tpm2b("attested.quote.pcrDigest")?.to_vec();
        r.finish()?;
        Ok(Self {
            qualified_signer,
            extra_data,
            clock,
            reset_count,
            restart_count,
            firmware_version,
            selections,
            pcr_digest,
        })
    }
}

/// A decoded TPMT_SIGNATURE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signature {
    /// TPM_ALG_RSASSA (PKCS#1 v1.5).
    RsaSsa {
        /// Hash of the signing scheme.
        hash: HashAlg,
        /// Raw signature (modulus-sized).
        sig: Vec<u8>,
    },
    /// TPM_ALG_ECDSA.
    Ecdsa {
        /// Hash of the signing scheme.
        hash: HashAlg,
        /// Big-endian r.
        r: Vec<u8>,
        /// Big-endian s.
        s: Vec<u8>,
    },
}

impl Signature {
    /// Parses a marshalled TPMT_SIGNATURE (RSASSA or ECDSA).
    pub fn parse(bytes: &[u8]) -> Result<Self, TpmError> {
        const S: &str = "TPMT_SIGNATURE";
        let mut r = Reader::new(bytes, S);
        let sig_alg = r.u16("sigAlg")?;
        let hash_id = r.u16("hash")?;
        let hash = HashAlg::from_tpm_alg(hash_id).ok_or(TpmError::Unsupported {
            structure: S,
            field: "hash",
            value: u64::from(hash_id),
        })?;
        let out = match sig_alg {
            ALG_RSASSA => Self::RsaSsa {
                hash,
                sig: r.tpm2b("signature.rsassa.sig")?.to_vec(),
            },
            ALG_ECDSA => Self::Ecdsa {
                hash,
                r: r.tpm2b("signature.ecdsa.signatureR")?.to_vec(),
                s: r.tpm2b("signature.ecdsa.signatureS")?.to_vec(),
            },
            other => {
                return Err(TpmError::Unsupported {
                    structure: S,
                    field: "sigAlg",
                    value: u64::from(other),
                });
            }
        };
        r.finish()?;
        Ok(out)
    }

    /// Marshals a raw RSASSA signature into a TPMT_SIGNATURE (for sources, such as Azure's
    /// `tpm-quote` JSON, that ship only the signature bytes).
    pub fn marshal_rsassa(hash: HashAlg, sig: &[u8]) -> Result<Vec<u8>, TpmError> {
        let len = u16::try_from(sig.len()).map_err(|_| TpmError::Unsupported {
            structure: "TPMT_SIGNATURE",
            field: "signature.rsassa.sig",
            value: sig.len() as u64,
        })?;
        let mut out = Vec::with_capacity(6 + sig.len());
        out.extend_from_slice(&ALG_RSASSA.to_be_bytes());
        out.extend_from_slice(&hash.tpm_alg().to_be_bytes());
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(sig);
        Ok(out)
    }

    /// The hash of the signing scheme.
    pub fn hash(&self) -> HashAlg {
        match self {
            Self::RsaSsa { hash, .. } | Self::Ecdsa { hash, .. } => *hash,
        }
    }
}

/// The public part of an attestation key, as found in a TPMT_PUBLIC or a JWK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AkKey {
    /// An RSA key.
    Rsa {
        /// Big-endian modulus.
        modulus: Vec<u8>,
        /// Public exponent.
        exponent: u32,
    },
    /// An ECC key on NIST P-256.
    EccP256 {
        /// Big-endian x coordinate.
        x: Vec<u8>,
        /// Big-endian y coordinate.
        y: Vec<u8>,
    },
}

/// TPMA_OBJECT fixedTPM.
const ATTR_FIXED_TPM: u32 = 1 << 1;
/// TPMA_OBJECT restricted.
const ATTR_RESTRICTED: u32 = 1 << 16;
/// TPMA_OBJECT sign.
const ATTR_SIGN: u32 = 1 << 18;

/// Checks that a marshalled TPMT_PUBLIC describes an attestation key: fixedTPM, restricted
/// and sign. A restricted key only signs data the TPM generated, so it cannot be used to
/// forge a TPMS_ATTEST.
pub fn check_ak_attributes(bytes: &[u8]) -> Result<(), TpmError> {
    let mut r = Reader::new(bytes, "TPMT_PUBLIC");
    r.u16("type")?;
    r.u16("nameAlg")?;
    let attributes = r.u32("objectAttributes")?;
    for (bit, name) in [
        (ATTR_FIXED_TPM, "fixedTPM"),
        (ATTR_RESTRICTED, "restricted"),
        (ATTR_SIGN, "sign"),
    ] {
        if attributes & bit == 0 {
            return Err(TpmError::AkAttributes {
                attributes,
                missing: name,
            });
        }
    }
    Ok(())
}

/// Parses a marshalled TPMT_PUBLIC holding an RSA or NIST P-256 key.
pub fn parse_tpmt_public(bytes: &[u8]) -> Result<AkKey, TpmError> {
    const S: &str = "TPMT_PUBLIC";
    let mut r = Reader::new(bytes, S);
    let kind = r.u16("type")?;
    let _name_alg = r.u16("nameAlg")?;
    let _attributes = r.u32("objectAttributes")?;
    let _auth_policy = r.tpm2b("authPolicy")?;
    let sym = r.u16("parameters.symmetric.algorithm")?;
    if sym != ALG_NULL {
        r.u16("parameters.symmetric.keyBits")?;
        r.u16("parameters.symmetric.mode")?;
    }
    let scheme = r.u16("parameters.scheme.scheme")?;
    if scheme != ALG_NULL {
        r.u16("parameters.scheme.details.hashAlg")?;
    }
    let key = match kind {
        ALG_RSA => {
            let _key_bits = r.u16("parameters.rsaDetail.keyBits")?;
            let exponent = match r.u32("parameters.rsaDetail.exponent")? {
                0 => 65_537,
                e => e,
            };
            let modulus = r.tpm2b("unique.rsa")?.to_vec();
            AkKey::Rsa { modulus, exponent }
        }
        ALG_ECC => {
            let curve = r.u16("parameters.eccDetail.curveID")?;
            if curve != ECC_NIST_P256 {
                return Err(TpmError::Unsupported {
                    structure: S,
                    field: "parameters.eccDetail.curveID",
                    value: u64::from(curve),
                });
            }
            let kdf = r.u16("parameters.eccDetail.kdf.scheme")?;
            if kdf != ALG_NULL {
                r.u16("parameters.eccDetail.kdf.details.hashAlg")?;
            }
            let x = r.tpm2b("unique.ecc.x")?.to_vec();
            let y = r.tpm2b("unique.ecc.y")?.to_vec();
            AkKey::EccP256 { x, y }
        }
        other => {
            return Err(TpmError::Unsupported {
                structure: S,
                field: "type",
                value: u64::from(other),
            });
        }
    };
    r.finish()?;
    Ok(key)
}
