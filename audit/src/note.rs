//! C2SP signed notes (`c2sp.org/signed-note`), tlog checkpoints (`c2sp.org/tlog-checkpoint`) and
//! witness cosignatures (`c2sp.org/tlog-cosignature`, `cosignature/v1`).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::merkle::Hash;

/// The signature algorithm byte of plain Ed25519 note signatures.
pub const ALG_ED25519: u8 = 0x01;
/// The signature algorithm byte of timestamped Ed25519 `cosignature/v1` signatures.
pub const ALG_COSIGNATURE_V1: u8 = 0x04;

const SIG_PREFIX: &str = "\u{2014} ";

/// A malformed or unverifiable note, checkpoint or key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NoteError {
    /// The note does not have a text part followed by a blank line and signature lines.
    #[error("malformed signed note: {0}")]
    Malformed(&'static str),
    /// The checkpoint body is malformed.
    #[error("malformed checkpoint: {0}")]
    Checkpoint(&'static str),
    /// A verifier key string is malformed.
    #[error("malformed verifier key: {0}")]
    Key(&'static str),
    /// No signature by the given key is present.
    #[error("no signature by key {0}")]
    MissingSignature(String),
    /// A signature by the given key is present but does not verify.
    #[error("signature by key {0} does not verify")]
    BadSignature(String),
    /// A signing key could not be created or loaded.
    #[error("signing key: {0}")]
    Signer(&'static str),
}

/// A checkpoint body: origin, tree size and root hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The log's origin (a unique name for the log).
    pub origin: String,
    /// The number of leaves in the tree.
    pub size: u64,
    /// The RFC 9162 root hash of the tree.
    pub root: Hash,
}

impl Checkpoint {
    /// The checkpoint text: `origin\nsize\nbase64(root)\n`.
    pub fn body(&self) -> String {
        format!(
            "{}\n{}\n{}\n",
            self.origin,
            self.size,
            B64.encode(self.root)
        )
    }

    /// Parses a checkpoint text (extension lines after the root are accepted and ignored).
    pub fn parse_body(text: &str) -> Result<Self, NoteError> {
        let mut lines = text.split('\n');
        let origin = lines.next().filter(|o| !o.is_empty());
        let origin = origin.ok_or(NoteError::Checkpoint("missing origin"))?;
        let size = lines.next().ok_or(NoteError::Checkpoint("missing size"))?;
        if size.is_empty() || (size.len() > 1 && size.starts_with('0')) {
            return Err(NoteError::Checkpoint("size is not a canonical decimal"));
        }
        let size: u64 = size
            .parse()
            .map_err(|_| NoteError::Checkpoint("size is not a decimal integer"))?;
        let root = lines
            .next()
            .ok_or(NoteError::Checkpoint("missing root hash"))?;
        let root: Hash = B64
            .decode(root)
            .ok()
            .and_then(|r| r.try_into().ok())
            .ok_or(NoteError::Checkpoint("root hash is not 32 bytes of base64"))?;
        Ok(Self {
            origin: origin.to_owned(),
            size,
            root,
        })
    }
}

/// One signature line of a note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoteSignature {
    /// The key name.
    pub name: String,
    /// The 4-byte key hash (key ID).
    pub key_hash: [u8; 4],
    /// The bytes after the key hash (a signature, or a timestamp and signature for cosignatures).
    pub bytes: Vec<u8>,
}

impl NoteSignature {
    fn line(&self) -> String {
        let mut raw = self.key_hash.to_vec();
        raw.extend_from_slice(&self.bytes);
        format!("{SIG_PREFIX}{} {}\n", self.name, B64.encode(raw))
    }
}

/// A signed note: a text ending in a newline, a blank line, then signature lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedNote {
    /// The signed text, including its final newline.
    pub text: String,
    /// The signature lines, in order.
    pub signatures: Vec<NoteSignature>,
}

impl SignedNote {
    /// Parses a signed note.
    pub fn parse(note: &str) -> Result<Self, NoteError> {
        let split = note
            .find("\n\n")
            .ok_or(NoteError::Malformed("no blank line before signatures"))?;
        let text = &note[..=split];
        let sigs = &note[split + 2..];
        if !sigs.ends_with('\n') {
            return Err(NoteError::Malformed(
                "signature block must end with a newline",
            ));
        }
        let mut signatures = Vec::new();
        for line in sigs[..sigs.len() - 1].split('\n') {
            let rest = line.strip_prefix(SIG_PREFIX).ok_or(NoteError::Malformed(
                "signature line must start with an em dash",
            ))?;
            let (name, b64) = rest
                .split_once(' ')
                .ok_or(NoteError::Malformed("signature line lacks a key name"))?;
            if name.is_empty() || name.contains('+') {
                return Err(NoteError::Malformed("bad key name"));
            }
            let raw = B64
                .decode(b64)
                .map_err(|_| NoteError::Malformed("signature is not base64"))?;
            if raw.len() < 5 {
                return Err(NoteError::Malformed("signature too short"));
            }
            signatures.push(NoteSignature {
                name: name.to_owned(),
                key_hash: [raw[0], raw[1], raw[2], raw[3]],
                bytes: raw[4..].to_vec(),
            });
        }
        if signatures.is_empty() {
            return Err(NoteError::Malformed("note has no signatures"));
        }
        Ok(Self {
            text: text.to_owned(),
            signatures,
        })
    }

    /// Serializes the note.
    pub fn render(&self) -> String {
        let mut out = self.text.clone();
        out.push('\n');
        for s in &self.signatures {
            out.push_str(&s.line());
        }
        out
    }

    /// The checkpoint this note carries.
    pub fn checkpoint(&self) -> Result<Checkpoint, NoteError> {
        Checkpoint::parse_body(&self.text)
    }
}

/// The key hash of a note key: the first 4 bytes of `SHA-256(name || "\n" || alg || public)`.
pub fn key_hash(name: &str, alg: u8, public: &[u8]) -> [u8; 4] {
    let mut h = Sha256::new();
    h.update(name.as_bytes());
    h.update(b"\n");
    h.update([alg]);
    h.update(public);
    let d = h.finalize();
    [d[0], d[1], d[2], d[3]]
}

/// A note verifier key: `name+hex(key_hash)+base64(alg || public key)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifierKey {
    /// The key name.
    pub name: String,
    /// The algorithm byte ([`ALG_ED25519`] or [`ALG_COSIGNATURE_V1`]).
    pub alg: u8,
    /// The Ed25519 public key.
    pub public: [u8; 32],
}

impl VerifierKey {
    /// Parses a verifier key string.
    pub fn parse(s: &str) -> Result<Self, NoteError> {
        let mut parts = s.trim().splitn(3, '+');
        let (Some(name), Some(hash), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(NoteError::Key("expected name+hash+key"));
        };
        let raw = B64
            .decode(key)
            .map_err(|_| NoteError::Key("key is not base64"))?;
        let (&alg, public) = raw.split_first().ok_or(NoteError::Key("empty key"))?;
        if alg != ALG_ED25519 && alg != ALG_COSIGNATURE_V1 {
            return Err(NoteError::Key("unsupported algorithm"));
        }
        let public: [u8; 32] = public
            .try_into()
            .map_err(|_| NoteError::Key("Ed25519 public key must be 32 bytes"))?;
        let k = Self {
            name: name.to_owned(),
            alg,
            public,
        };
        if hex::encode(k.key_hash()) != hash {
            return Err(NoteError::Key("key hash does not match the key"));
        }
        Ok(k)
    }

    /// This key's 4-byte key hash.
    pub fn key_hash(&self) -> [u8; 4] {
        key_hash(&self.name, self.alg, &self.public)
    }

    /// Renders the verifier key string.
    pub fn render(&self) -> String {
        let mut raw = vec![self.alg];
        raw.extend_from_slice(&self.public);
        format!(
            "{}+{}+{}",
            self.name,
            hex::encode(self.key_hash()),
            B64.encode(raw)
        )
    }

    /// Verifies this key's signature on `note`; for a cosignature key, returns its timestamp.
    pub fn verify(&self, note: &SignedNote) -> Result<Option<u64>, NoteError> {
        let hash = self.key_hash();
        let sig = note
            .signatures
            .iter()
            .find(|s| s.name == self.name && s.key_hash == hash)
            .ok_or_else(|| NoteError::MissingSignature(self.name.clone()))?;
        let bad = || NoteError::BadSignature(self.name.clone());
        let public = UnparsedPublicKey::new(&ED25519, &self.public);
        if self.alg == ALG_COSIGNATURE_V1 {
            let ts: [u8; 8] = sig
                .bytes
                .get(..8)
                .and_then(|t| t.try_into().ok())
                .ok_or_else(bad)?;
            let ts = u64::from_be_bytes(ts);
            let msg = cosignature_message(ts, &note.text);
            public
                .verify(msg.as_bytes(), &sig.bytes[8..])
                .map_err(|_| bad())?;
            Ok(Some(ts))
        } else {
            public
                .verify(note.text.as_bytes(), &sig.bytes)
                .map_err(|_| bad())?;
            Ok(None)
        }
    }
}

/// The message a `cosignature/v1` signs: `cosignature/v1\ntime <ts>\n` followed by the checkpoint.
pub fn cosignature_message(timestamp: u64, checkpoint_text: &str) -> String {
    format!("cosignature/v1\ntime {timestamp}\n{checkpoint_text}")
}

/// An Ed25519 note signer. The private key lives only in memory; the PKCS#8 bytes it was made
/// from are zeroized as soon as the key pair is built.
pub struct NoteSigner {
    name: String,
    alg: u8,
    pair: Ed25519KeyPair,
}

impl std::fmt::Debug for NoteSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NoteSigner")
            .field("verifier", &self.verifier().render())
            .finish_non_exhaustive()
    }
}

impl NoteSigner {
    /// Generates a fresh Ed25519 key for signing checkpoints of log `name`.
    pub fn generate(name: &str) -> Result<Self, NoteError> {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng)
            .map_err(|_| NoteError::Signer("Ed25519 key generation failed"))?;
        let pkcs8 = Zeroizing::new(pkcs8.as_ref().to_vec());
        Self::from_pkcs8(name, ALG_ED25519, &pkcs8)
    }

    /// Loads an Ed25519 key from PKCS#8 (v1 or v2) DER; `alg` selects plain note signatures or
    /// `cosignature/v1` cosignatures.
    pub fn from_pkcs8(name: &str, alg: u8, pkcs8: &[u8]) -> Result<Self, NoteError> {
        if name.is_empty() || name.contains('+') || name.contains(char::is_whitespace) {
            return Err(NoteError::Signer(
                "key name must be non-empty without '+' or spaces",
            ));
        }
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(pkcs8)
            .map_err(|_| NoteError::Signer("not an Ed25519 PKCS#8 key"))?;
        Ok(Self {
            name: name.to_owned(),
            alg,
            pair,
        })
    }

    /// The verifier key matching this signer.
    pub fn verifier(&self) -> VerifierKey {
        let mut public = [0u8; 32];
        public.copy_from_slice(self.pair.public_key().as_ref());
        VerifierKey {
            name: self.name.clone(),
            alg: self.alg,
            public,
        }
    }

    /// Signs `text` as a plain Ed25519 note signature.
    pub fn sign(&self, text: &str) -> NoteSignature {
        NoteSignature {
            name: self.name.clone(),
            key_hash: self.verifier().key_hash(),
            bytes: self.pair.sign(text.as_bytes()).as_ref().to_vec(),
        }
    }

    /// Produces a `cosignature/v1` signature of checkpoint text `text` at `timestamp`.
    pub fn cosign(&self, text: &str, timestamp: u64) -> NoteSignature {
        let msg = cosignature_message(timestamp, text);
        let mut bytes = timestamp.to_be_bytes().to_vec();
        bytes.extend_from_slice(self.pair.sign(msg.as_bytes()).as_ref());
        NoteSignature {
            name: self.name.clone(),
            key_hash: self.verifier().key_hash(),
            bytes,
        }
    }

    /// Signs a checkpoint, producing a signed note.
    pub fn sign_checkpoint(&self, checkpoint: &Checkpoint) -> SignedNote {
        let text = checkpoint.body();
        let signature = self.sign(&text);
        SignedNote {
            text,
            signatures: vec![signature],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_parse_verify() {
        let signer = NoteSigner::generate("example.com/log").expect("key");
        let cp = Checkpoint {
            origin: "example.com/log".into(),
            size: 42,
            root: [7; 32],
        };
        let note = signer.sign_checkpoint(&cp);
        let text = note.render();
        let parsed = SignedNote::parse(&text).expect("parses");
        assert_eq!(parsed.checkpoint().expect("checkpoint"), cp);
        let vkey = VerifierKey::parse(&signer.verifier().render()).expect("vkey");
        assert_eq!(vkey.verify(&parsed), Ok(None));
        let tampered = text.replace("\n42\n", "\n43\n");
        let tampered = SignedNote::parse(&tampered).expect("parses");
        assert!(matches!(
            vkey.verify(&tampered),
            Err(NoteError::BadSignature(_))
        ));
    }

    #[test]
    fn cosignature_carries_timestamp() {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).expect("key");
        let w = NoteSigner::from_pkcs8("witness.example/w1", ALG_COSIGNATURE_V1, pkcs8.as_ref())
            .expect("signer");
        let mut note = SignedNote {
            text: "o\n1\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n".into(),
            signatures: Vec::new(),
        };
        note.signatures.push(w.cosign(&note.text, 1_700_000_000));
        let parsed = SignedNote::parse(&note.render()).expect("parses");
        assert_eq!(w.verifier().verify(&parsed), Ok(Some(1_700_000_000)));
    }
}
