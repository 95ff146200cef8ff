//! Text formats for proofs exchanged as files.
//!
//! Consistency proof: `inferno-audit-consistency/v1\nold <m>\nnew <n>\n` followed by one base64
//! hash per line. Inclusion proof: `inferno-audit-inclusion/v1\nindex <i>\nsize <n>\nleaf
//! <base64 leaf hash>\n` followed by one base64 hash per line.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;

use crate::merkle::Hash;

const CONSISTENCY_MAGIC: &str = "inferno-audit-consistency/v1";
const INCLUSION_MAGIC: &str = "inferno-audit-inclusion/v1";

/// A malformed proof file.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("malformed proof file: {0}")]
pub struct ProofFileError(pub String);

/// A consistency proof between two tree sizes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsistencyProof {
    /// The older tree size.
    pub old: u64,
    /// The newer tree size.
    pub new: u64,
    /// The proof hashes.
    pub hashes: Vec<Hash>,
}

/// An inclusion proof of one leaf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InclusionProof {
    /// The leaf index.
    pub index: u64,
    /// The tree size.
    pub size: u64,
    /// The leaf hash.
    pub leaf: Hash,
    /// The proof hashes.
    pub hashes: Vec<Hash>,
}

fn field(lines: &mut std::str::Lines<'_>, name: &str) -> Result<String, ProofFileError> {
    let line = lines
        .next()
        .ok_or_else(|| ProofFileError(format!("missing `{name}` line")))?;
    line.strip_prefix(name)
        .and_then(|r| r.strip_prefix(' '))
        .map(str::to_owned)
        .ok_or_else(|| ProofFileError(format!("expected `{name} ...`, found {line:?}")))
}

fn number(lines: &mut std::str::Lines<'_>, name: &str) -> Result<u64, ProofFileError> {
    field(lines, name)?
        .parse()
        .map_err(|_| ProofFileError(format!("`{name}` is not a number")))
}

fn hash(text: &str) -> Result<Hash, ProofFileError> {
    B64.decode(text)
        .ok()
        .and_then(|h| h.try_into().ok())
        .ok_or_else(|| ProofFileError(format!("{text:?} is not a base64 SHA-256 hash")))
}

fn hashes(lines: std::str::Lines<'_>) -> Result<Vec<Hash>, ProofFileError> {
    lines.filter(|l| !l.is_empty()).map(hash).collect()
}

fn magic(lines: &mut std::str::Lines<'_>, want: &str) -> Result<(), ProofFileError> {
    match lines.next() {
        Some(l) if l == want => Ok(()),
        other => Err(ProofFileError(format!(
            "expected {want:?}, found {other:?}"
        ))),
    }
}

impl ConsistencyProof {
    /// Renders the proof file.
    pub fn render(&self) -> String {
        let mut s = format!("{CONSISTENCY_MAGIC}\nold {}\nnew {}\n", self.old, self.new);
        for h in &self.hashes {
            s.push_str(&B64.encode(h));
            s.push('\n');
        }
        s
    }

    /// Parses a proof file.
    pub fn parse(text: &str) -> Result<Self, ProofFileError> {
        let mut lines = text.lines();
        magic(&mut lines, CONSISTENCY_MAGIC)?;
        let old = number(&mut lines, "old")?;
        let new = number(&mut lines, "new")?;
        Ok(Self {
            old,
            new,
            hashes: hashes(lines)?,
        })
    }
}

impl InclusionProof {
    /// Renders the proof file.
    pub fn render(&self) -> String {
        let mut s = format!(
            "{INCLUSION_MAGIC}\nindex {}\nsize {}\nleaf {}\n",
            self.index,
            self.size,
            B64.encode(self.leaf)
        );
        for h in &self.hashes {
            s.push_str(&B64.encode(h));
            s.push('\n');
        }
        s
    }

    /// Parses a proof file.
    pub fn parse(text: &str) -> Result<Self, ProofFileError> {
        let mut lines = text.lines();
        magic(&mut lines, INCLUSION_MAGIC)?;
        let index = number(&mut lines, "index")?;
        let size = number(&mut lines, "size")?;
        let leaf = hash(&field(&mut lines, "leaf")?)?;
        Ok(Self {
            index,
            size,
            leaf,
            hashes: hashes(lines)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let c = ConsistencyProof {
            old: 3,
            new: 9,
            hashes: vec![[1; 32], [2; 32]],
        };
        assert_eq!(ConsistencyProof::parse(&c.render()), Ok(c));
        let i = InclusionProof {
            index: 4,
            size: 9,
            leaf: [5; 32],
            hashes: vec![[3; 32]],
        };
        assert_eq!(InclusionProof::parse(&i.render()), Ok(i));
        assert!(ConsistencyProof::parse("old 1\nnew 2\n").is_err());
    }
}
