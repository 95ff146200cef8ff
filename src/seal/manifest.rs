//! The sealed model's header, `inferno-sealed.json`: what was sealed, how, and under which key.
//!
//! The manifest is parsed strictly (unknown fields are refused) and checked before any chunk is
//! read; its SHA-256, over the exact bytes of the file, is bound into every chunk's associated
//! data, so changing any byte of it makes every chunk fail authentication.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::error::SealError;
use crate::model::{FileDigest, ModelDigest};

/// The manifest's file name inside a sealed model directory.
pub const MANIFEST_FILE: &str = "inferno-sealed.json";
/// Appended to a plaintext file's name to name its sealed file.
pub const SEALED_SUFFIX: &str = ".sealed";
/// The `format` field.
pub const FORMAT: &str = "inferno-sealed-model";
/// The format version this code writes and reads (2: per-file values are block-hash digests;
/// version 1 carried whole-file SHA-256s).
pub const VERSION: u32 = 2;
/// The only algorithm of versions 1 and 2.
pub const ALGORITHM: &str = "AES-256-GCM";
/// The chunk size `inferno seal` uses unless told otherwise (4 MiB).
pub const DEFAULT_CHUNK_SIZE: u64 = 4 << 20;
/// The smallest chunk size accepted.
pub const MIN_CHUNK_SIZE: u64 = 4 << 10;
/// The largest chunk size accepted.
pub const MAX_CHUNK_SIZE: u64 = 1 << 30;
/// The most files a sealed model may hold.
pub const MAX_FILES: usize = 4096;
/// The largest file accepted (1 PiB: keeps every length computation far from overflow).
pub const MAX_FILE_SIZE: u64 = 1 << 50;
/// The largest manifest accepted.
pub const MAX_MANIFEST_LEN: u64 = 4 << 20;

/// The header of a sealed model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always [`FORMAT`].
    pub format: String,
    /// The format version ([`VERSION`]).
    pub version: u32,
    /// The chunk cipher ([`ALGORITHM`]).
    pub algorithm: String,
    /// Plaintext bytes per chunk (the last chunk of a file may be shorter).
    pub chunk_size: u64,
    /// The model key's id (`ModelKey::id`): 16 bytes, hex.
    pub key_id: String,
    /// 32 random bytes (hex), fresh for every sealing: the HKDF salt of the file keys.
    pub salt: String,
    /// The model digest of the plaintext files (`src/model/digest.rs`), hex.
    pub model_digest: String,
    /// Every sealed file, sorted by the bytes of its name.
    pub files: Vec<SealedFile>,
    /// What the appliance must satisfy before it uses the key.
    #[serde(default)]
    pub release: ReleaseRequirements,
    /// The model key wrapped to a key broker's public key (`inferno seal --recipient`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wrapped_key: Option<WrappedKey>,
}

/// One plaintext file of the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SealedFile {
    /// The plaintext file's name; the sealed file is `<name>.sealed`.
    pub name: String,
    /// The plaintext length in bytes.
    pub size: u64,
    /// The plaintext's file value (SHA-256 of its 16 MiB blocks' hashes, `docs/model-loading.md`),
    /// hex.
    pub digest: String,
}

/// Release requirements recorded at sealing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequirements {
    /// The model id a key broker files the key under (default: the model directory's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_id: Option<String>,
    /// Server policy digests (hex SHA-256) under which the model may be opened; empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policy_sha256: Vec<String>,
}

/// The model key wrapped with HPKE (RFC 9180, base mode) to a key broker's X25519 key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WrappedKey {
    /// The suite: `DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, AES-256-GCM`.
    pub suite: String,
    /// The recipient's public key, hex.
    pub recipient: String,
    /// The encapsulated key, hex.
    pub enc: String,
    /// The wrapped model key (ciphertext and tag), hex.
    pub ciphertext: String,
}

impl Manifest {
    /// Parses and checks a manifest; returns it with its header digest (SHA-256 of `bytes`).
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<(Self, [u8; 32]), SealError> {
        let bad = |reason: String| SealError::Manifest {
            path: path.to_path_buf(),
            reason,
        };
        if bytes.len() as u64 > MAX_MANIFEST_LEN {
            return Err(bad(format!("longer than {MAX_MANIFEST_LEN} bytes")));
        }
        let manifest: Self = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
        manifest.check().map_err(bad)?;
        let mut digest = [0u8; 32];
        digest.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref());
        Ok((manifest, digest))
    }

    /// Reads and parses `dir`'s manifest.
    pub fn read(dir: &Path) -> Result<(Self, [u8; 32]), SealError> {
        let path = dir.join(MANIFEST_FILE);
        let len = std::fs::metadata(&path)
            .map_err(SealError::io(&path))?
            .len();
        if len > MAX_MANIFEST_LEN {
            return Err(SealError::Manifest {
                path,
                reason: format!("longer than {MAX_MANIFEST_LEN} bytes"),
            });
        }
        let bytes = crate::model::files::read_regular(&path).map_err(SealError::io(&path))?;
        Self::parse(&path, &bytes)
    }

    /// The bytes written to disk (pretty JSON, newline-terminated).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec_pretty(self).expect("a manifest serializes");
        bytes.push(b'\n');
        bytes
    }

    /// The salt as bytes (checked by `parse`).
    pub fn salt_bytes(&self) -> [u8; 32] {
        let mut salt = [0u8; 32];
        hex::decode_to_slice(&self.salt, &mut salt).expect("checked by Manifest::check");
        salt
    }

    /// The model digest the file list implies.
    pub fn implied_digest(&self) -> ModelDigest {
        ModelDigest::from_files(
            self.files
                .iter()
                .map(|f| FileDigest {
                    name: f.name.clone(),
                    value: f.digest.clone(),
                })
                .collect(),
        )
    }

    /// Every structural rule of this version.
    fn check(&self) -> Result<(), String> {
        if self.format != FORMAT {
            return Err(format!("format `{}`, expected `{FORMAT}`", self.format));
        }
        if self.version != VERSION {
            return Err(format!("unsupported version {}", self.version));
        }
        if self.algorithm != ALGORITHM {
            return Err(format!("unsupported algorithm `{}`", self.algorithm));
        }
        if !(MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&self.chunk_size) {
            return Err(format!(
                "chunk_size {} outside {MIN_CHUNK_SIZE}..={MAX_CHUNK_SIZE}",
                self.chunk_size
            ));
        }
        check_hex("key_id", &self.key_id, 16)?;
        check_hex("salt", &self.salt, 32)?;
        check_hex("model_digest", &self.model_digest, 32)?;
        if self.files.is_empty() || self.files.len() > MAX_FILES {
            return Err(format!(
                "{} files (1..={MAX_FILES} allowed)",
                self.files.len()
            ));
        }
        for (i, file) in self.files.iter().enumerate() {
            if !is_model_file_name(&file.name) {
                return Err(format!("files[{i}]: unusable file name {:?}", file.name));
            }
            if i > 0 && self.files[i - 1].name.as_bytes() >= file.name.as_bytes() {
                return Err(format!(
                    "files[{i}]: {:?} is not after {:?} (names must be sorted and unique)",
                    file.name,
                    self.files[i - 1].name
                ));
            }
            if file.size > MAX_FILE_SIZE {
                return Err(format!("files[{i}]: size {} too large", file.size));
            }
            check_hex(&format!("files[{i}].digest"), &file.digest, 32)?;
        }
        for (i, digest) in self.release.policy_sha256.iter().enumerate() {
            check_hex(&format!("release.policy_sha256[{i}]"), digest, 32)?;
        }
        if let Some(wrapped) = &self.wrapped_key {
            super::recipient::check_wrapped(wrapped)?;
        }
        let implied = self.implied_digest();
        if implied.hex != self.model_digest {
            return Err(format!(
                "model_digest {} does not match its file list ({})",
                self.model_digest, implied.hex
            ));
        }
        Ok(())
    }
}

/// Whether `name` may name a model file: plain (no path separators, not `.`/`..`), no tab or
/// newline (the digest's separators), not the manifest, and not too long.
pub fn is_model_file_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255 - SEALED_SUFFIX.len()
        && name != "."
        && name != ".."
        && name != MANIFEST_FILE
        && !name.contains(['/', '\\', '\t', '\n', '\0'])
}

/// Checks that `value` is `len` bytes of lowercase hex.
pub(crate) fn check_hex(field: &str, value: &str, len: usize) -> Result<(), String> {
    if value.len() == 2 * len
        && value
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(())
    } else {
        Err(format!("{field}: expected {len} bytes of lowercase hex"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Manifest {
        let files = vec![
            SealedFile {
                name: "config.json".into(),
                size: 2,
                digest: "aa".repeat(32),
            },
            SealedFile {
                name: "model.safetensors".into(),
                size: 10_000_000,
                digest: "bb".repeat(32),
            },
        ];
        let mut manifest = Manifest {
            format: FORMAT.into(),
            version: VERSION,
            algorithm: ALGORITHM.into(),
            chunk_size: DEFAULT_CHUNK_SIZE,
            key_id: "01".repeat(16),
            salt: "02".repeat(32),
            model_digest: String::new(),
            files,
            release: ReleaseRequirements::default(),
            wrapped_key: None,
        };
        manifest.model_digest = manifest.implied_digest().hex;
        manifest
    }

    #[test]
    fn a_written_manifest_parses_back() {
        let manifest = sample();
        let bytes = manifest.to_bytes();
        let (parsed, digest) = Manifest::parse(Path::new("m"), &bytes).unwrap();
        assert_eq!(parsed, manifest);
        assert_eq!(
            digest.as_slice(),
            ring::digest::digest(&ring::digest::SHA256, &bytes).as_ref()
        );
    }

    #[test]
    fn inconsistent_manifests_are_refused() {
        type Change = fn(&mut Manifest);
        let cases: Vec<(Change, &str)> = vec![
            (|m| m.version = 1, "unsupported version"),
            (|m| m.algorithm = "AES-128-GCM".into(), "algorithm"),
            (|m| m.chunk_size = 1, "chunk_size"),
            (|m| m.key_id = "XY".repeat(16), "key_id"),
            (|m| m.files[0].name = "../x".into(), "unusable file name"),
            (|m| m.files.swap(0, 1), "sorted"),
            (|m| m.files[0].digest = "cc".repeat(32), "does not match"),
            (|m| m.files.clear(), "0 files"),
        ];
        for (change, expected) in cases {
            let mut manifest = sample();
            change(&mut manifest);
            let err = Manifest::parse(Path::new("m"), &manifest.to_bytes())
                .unwrap_err()
                .to_string();
            assert!(err.contains(expected), "{expected}: {err}");
        }
        let err = Manifest::parse(Path::new("m"), br#"{"format":"x","extra":1}"#)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("sealed manifest m: "), "{err}");
    }

    proptest! {
        /// The parser never panics on arbitrary bytes, and accepts nothing that fails its own
        /// checks.
        #[test]
        fn parser_survives_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            if let Ok((manifest, _)) = Manifest::parse(Path::new("m"), &bytes) {
                prop_assert!(manifest.check().is_ok());
            }
        }

        /// Any single-byte change to a valid manifest is refused or yields a different header
        /// digest (so every chunk fails authentication).
        #[test]
        fn parser_survives_mutations(pos in any::<prop::sample::Index>(), byte in any::<u8>()) {
            let bytes = sample().to_bytes();
            let (_, original) = Manifest::parse(Path::new("m"), &bytes).unwrap();
            let mut mutated = bytes.clone();
            let i = pos.index(mutated.len());
            prop_assume!(mutated[i] != byte);
            mutated[i] = byte;
            if let Ok((_, digest)) = Manifest::parse(Path::new("m"), &mutated) {
                prop_assert_ne!(digest, original);
            }
        }
    }
}
