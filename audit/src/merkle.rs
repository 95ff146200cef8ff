//! RFC 9162 (Certificate Transparency 2.0) Merkle tree hashing, inclusion proofs and
//! consistency proofs.
//!
//! Leaves are hashed as `SHA-256(0x00 || leaf)` and interior nodes as
//! `SHA-256(0x01 || left || right)`; the root of the empty tree is `SHA-256("")`.

use sha2::{Digest, Sha256};

/// A SHA-256 hash: a leaf hash, an interior node hash or a tree root.
pub type Hash = [u8; 32];

/// Why a proof could not be generated or did not verify.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProofError {
    /// The requested leaf index is not below the tree size.
    #[error("leaf index {index} is outside a tree of size {size}")]
    IndexOutOfRange {
        /// The requested leaf index.
        index: u64,
        /// The tree size.
        size: u64,
    },
    /// The older tree size of a consistency proof is larger than the newer one.
    #[error("old tree size {old} is larger than new tree size {new}")]
    SizesOutOfOrder {
        /// The older tree size.
        old: u64,
        /// The newer tree size.
        new: u64,
    },
    /// The proof has the wrong number of hashes for the tree sizes.
    #[error("proof has the wrong length")]
    WrongLength,
    /// The recomputed root does not match the expected root.
    #[error("recomputed root does not match")]
    RootMismatch,
}

/// Hashes one leaf: `SHA-256(0x00 || leaf)`.
pub fn leaf_hash(leaf: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update([0u8]);
    h.update(leaf);
    h.finalize().into()
}

/// Hashes an interior node: `SHA-256(0x01 || left || right)`.
pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// The root of the empty tree, `SHA-256("")`.
pub fn empty_root() -> Hash {
    Sha256::digest([]).into()
}

/// The largest power of two strictly smaller than `n` (`n` must be at least 2).
fn split_point(n: usize) -> usize {
    let mut k = 1;
    while k << 1 < n {
        k <<= 1;
    }
    k
}

/// The Merkle tree hash (root) of a list of leaf hashes.
pub fn root(leaves: &[Hash]) -> Hash {
    match leaves.len() {
        0 => empty_root(),
        1 => leaves[0],
        n => {
            let k = split_point(n);
            node_hash(&root(&leaves[..k]), &root(&leaves[k..]))
        }
    }
}

/// The inclusion proof (audit path) of leaf `index` in the tree made of `leaves`.
pub fn inclusion_proof(index: u64, leaves: &[Hash]) -> Result<Vec<Hash>, ViewError> {
    TreeView::new(&Frontier::new(), leaves).inclusion_proof(index, leaves.len() as u64)
}

/// Verifies an inclusion proof (RFC 9162 section 2.1.3.2).
pub fn verify_inclusion(
    index: u64,
    size: u64,
    leaf: &Hash,
    proof: &[Hash],
    expected_root: &Hash,
) -> Result<(), ProofError> {
    if index >= size {
        return Err(ProofError::IndexOutOfRange { index, size });
    }
    let (mut fnode, mut snode) = (index, size - 1);
    let mut r = *leaf;
    for p in proof {
        if snode == 0 {
            return Err(ProofError::WrongLength);
        }
        if fnode & 1 == 1 || fnode == snode {
            r = node_hash(p, &r);
            while fnode & 1 == 0 && fnode != 0 {
                fnode >>= 1;
                snode >>= 1;
            }
        } else {
            r = node_hash(&r, p);
        }
        fnode >>= 1;
        snode >>= 1;
    }
    if snode != 0 {
        return Err(ProofError::WrongLength);
    }
    if &r != expected_root {
        return Err(ProofError::RootMismatch);
    }
    Ok(())
}

/// The consistency proof between the tree of the first `old` leaves and the tree made of all
/// `leaves` (RFC 9162 section 2.1.4.1).
pub fn consistency_proof(old: u64, leaves: &[Hash]) -> Result<Vec<Hash>, ViewError> {
    TreeView::new(&Frontier::new(), leaves).consistency_proof(old, leaves.len() as u64)
}

/// Verifies a consistency proof between two tree heads (RFC 9162 section 2.1.4.2).
pub fn verify_consistency(
    old: u64,
    new: u64,
    old_root: &Hash,
    new_root: &Hash,
    proof: &[Hash],
) -> Result<(), ProofError> {
    if old > new {
        return Err(ProofError::SizesOutOfOrder { old, new });
    }
    if old == new {
        if !proof.is_empty() {
            return Err(ProofError::WrongLength);
        }
        return if old_root == new_root {
            Ok(())
        } else {
            Err(ProofError::RootMismatch)
        };
    }
    if old == 0 {
        return if proof.is_empty() {
            Ok(())
        } else {
            Err(ProofError::WrongLength)
        };
    }
    let mut path: Vec<Hash> = Vec::with_capacity(proof.len() + 1);
    if old.is_power_of_two() {
        path.push(*old_root);
    }
    path.extend_from_slice(proof);
    let Some((first, rest)) = path.split_first() else {
        return Err(ProofError::WrongLength);
    };
    let (mut fnode, mut snode) = (old - 1, new - 1);
    while fnode & 1 == 1 {
        fnode >>= 1;
        snode >>= 1;
    }
    let (mut fr, mut sr) = (*first, *first);
    for c in rest {
        if snode == 0 {
            return Err(ProofError::WrongLength);
        }
        if fnode & 1 == 1 || fnode == snode {
            fr = node_hash(c, &fr);
            sr = node_hash(c, &sr);
            while fnode & 1 == 0 && fnode != 0 {
                fnode >>= 1;
                snode >>= 1;
            }
        } else {
            sr = node_hash(&sr, c);
        }
        fnode >>= 1;
        snode >>= 1;
    }
    if snode != 0 {
        return Err(ProofError::WrongLength);
    }
    if &fr != old_root || &sr != new_root {
        return Err(ProofError::RootMismatch);
    }
    Ok(())
}

/// The right edge of a growing tree: the roots of its maximal perfect subtrees, largest first.
///
/// It gives the root of the tree after every append in `O(log n)` space, and is what a pruned
/// log keeps in place of the leaves it dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Frontier {
    size: u64,
    subtrees: Vec<Hash>,
}

impl Frontier {
    /// An empty tree.
    pub fn new() -> Self {
        Self::default()
    }

    /// Rebuilds a frontier from its size and subtree roots (largest first); `None` if the number
    /// of subtrees does not match the number of one bits of `size`.
    pub fn from_parts(size: u64, subtrees: Vec<Hash>) -> Option<Self> {
        (size.count_ones() as usize == subtrees.len()).then_some(Self { size, subtrees })
    }

    /// The number of leaves appended so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The roots of the maximal perfect subtrees, largest first.
    pub fn subtrees(&self) -> &[Hash] {
        &self.subtrees
    }

    /// Appends one leaf hash.
    pub fn push(&mut self, leaf: Hash) {
        let mut h = leaf;
        let mut n = self.size;
        while n & 1 == 1 {
            if let Some(left) = self.subtrees.pop() {
                h = node_hash(&left, &h);
            }
            n >>= 1;
        }
        self.subtrees.push(h);
        self.size += 1;
    }

    /// The root of the tree of all leaves appended so far.
    pub fn root(&self) -> Hash {
        let mut it = self.subtrees.iter().rev();
        match it.next() {
            None => empty_root(),
            Some(last) => it.fold(*last, |acc, left| node_hash(left, &acc)),
        }
    }
}

/// A tree whose first leaves may have been pruned: the pruned prefix is known only by its
/// [`Frontier`], the rest by its leaf hashes. Proofs and roots that need only the frontier's
/// subtrees and the kept leaves can still be computed.
#[derive(Debug, Clone, Copy)]
pub struct TreeView<'a> {
    prefix: &'a Frontier,
    leaves: &'a [Hash],
}

/// A [`TreeView`] could not produce a proof.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ViewError {
    /// The request itself is invalid.
    #[error(transparent)]
    Proof(#[from] ProofError),
    /// The proof needs hashes of leaves that were pruned.
    #[error("the proof needs leaves that were pruned (the log keeps leaves from index {0})")]
    Pruned(u64),
}

impl<'a> TreeView<'a> {
    /// A view of `prefix` followed by `leaves`.
    pub fn new(prefix: &'a Frontier, leaves: &'a [Hash]) -> Self {
        Self { prefix, leaves }
    }

    /// The total number of leaves (pruned and kept).
    pub fn size(&self) -> u64 {
        self.prefix.size() + self.leaves.len() as u64
    }

    /// The root of the leaf range `[lo, hi)`, if it can be computed.
    fn range_root(&self, lo: u64, hi: u64) -> Option<Hash> {
        let k = self.prefix.size();
        if lo >= k {
            let (a, b) = (usize::try_from(lo - k).ok()?, usize::try_from(hi - k).ok()?);
            return self.leaves.get(a..b).map(root);
        }
        let mut start = 0u64;
        for (bit, h) in (0..64u32)
            .rev()
            .filter(|b| k >> b & 1 == 1)
            .zip(self.prefix.subtrees())
        {
            let end = start + (1u64 << bit);
            if (lo, hi) == (start, end) {
                return Some(*h);
            }
            start = end;
        }
        if hi - lo < 2 {
            return None;
        }
        let split = split_point(usize::try_from(hi - lo).ok()?) as u64;
        Some(node_hash(
            &self.range_root(lo, lo + split)?,
            &self.range_root(lo + split, hi)?,
        ))
    }

    /// The root of the tree of the first `size` leaves.
    pub fn root_at(&self, size: u64) -> Result<Hash, ViewError> {
        if size > self.size() {
            return Err(ProofError::IndexOutOfRange {
                index: size,
                size: self.size(),
            }
            .into());
        }
        if size == 0 {
            return Ok(empty_root());
        }
        self.range_root(0, size)
            .ok_or(ViewError::Pruned(self.prefix.size()))
    }

    /// The inclusion proof of leaf `index` in the tree of the first `size` leaves.
    pub fn inclusion_proof(&self, index: u64, size: u64) -> Result<Vec<Hash>, ViewError> {
        if index >= size || size > self.size() {
            return Err(ProofError::IndexOutOfRange { index, size }.into());
        }
        let mut out = Vec::new();
        self.path(index, 0, size, &mut out)
            .ok_or(ViewError::Pruned(self.prefix.size()))?;
        Ok(out)
    }

    fn path(&self, m: u64, lo: u64, hi: u64, out: &mut Vec<Hash>) -> Option<()> {
        let n = hi - lo;
        if n <= 1 {
            return Some(());
        }
        let k = split_point(usize::try_from(n).ok()?) as u64;
        if m < k {
            self.path(m, lo, lo + k, out)?;
            out.push(self.range_root(lo + k, hi)?);
        } else {
            self.path(m - k, lo + k, hi, out)?;
            out.push(self.range_root(lo, lo + k)?);
        }
        Some(())
    }

    /// The consistency proof from the tree of the first `old` leaves to that of the first `new`.
    pub fn consistency_proof(&self, old: u64, new: u64) -> Result<Vec<Hash>, ViewError> {
        if old > new {
            return Err(ProofError::SizesOutOfOrder { old, new }.into());
        }
        if new > self.size() {
            return Err(ProofError::IndexOutOfRange {
                index: new,
                size: self.size(),
            }
            .into());
        }
        let mut out = Vec::new();
        if old == 0 || old == new {
            return Ok(out);
        }
        self.subproof(old, 0, new, true, &mut out)
            .ok_or(ViewError::Pruned(self.prefix.size()))?;
        Ok(out)
    }

    fn subproof(
        &self,
        m: u64,
        lo: u64,
        hi: u64,
        complete: bool,
        out: &mut Vec<Hash>,
    ) -> Option<()> {
        let n = hi - lo;
        if m == n {
            if !complete {
                out.push(self.range_root(lo, hi)?);
            }
            return Some(());
        }
        let k = split_point(usize::try_from(n).ok()?) as u64;
        if m <= k {
            self.subproof(m, lo, lo + k, complete, out)?;
            out.push(self.range_root(lo + k, hi)?);
        } else {
            self.subproof(m - k, lo + k, hi, false, out)?;
            out.push(self.range_root(lo, lo + k)?);
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaves(n: usize) -> Vec<Hash> {
        (0..n)
            .map(|i| leaf_hash(&(i as u64).to_le_bytes()))
            .collect()
    }

    #[test]
    fn empty_tree_root_is_sha256_of_nothing() {
        assert_eq!(
            hex::encode(root(&[])),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn frontier_matches_recursive_root() {
        let l = leaves(70);
        let mut f = Frontier::new();
        for (i, h) in l.iter().enumerate() {
            f.push(*h);
            assert_eq!(f.root(), root(&l[..=i]), "size {}", i + 1);
        }
    }

    #[test]
    fn pruned_view_proves_what_the_full_tree_proves() {
        let l = leaves(23);
        for cut in [0usize, 1, 3, 8, 13, 16] {
            let mut prefix = Frontier::new();
            for h in &l[..cut] {
                prefix.push(*h);
            }
            let view = TreeView::new(&prefix, &l[cut..]);
            assert_eq!(view.root_at(23), Ok(root(&l)));
            for size in cut.max(1)..=23 {
                assert_eq!(view.root_at(size as u64), Ok(root(&l[..size])));
                for i in cut..size {
                    let p = view.inclusion_proof(i as u64, size as u64).expect("proof");
                    assert_eq!(p, inclusion_proof(i as u64, &l[..size]).expect("full"));
                }
                for old in cut.max(1)..=size {
                    let p = view
                        .consistency_proof(old as u64, size as u64)
                        .expect("proof");
                    assert_eq!(p, consistency_proof(old as u64, &l[..size]).expect("full"));
                }
            }
        }
    }

    #[test]
    fn rfc6962_test_vector_root() {
        // The eight-leaf tree from the certificate-transparency test vectors.
        let data: [&[u8]; 8] = [
            b"",
            b"\x00",
            b"\x10",
            b"\x20\x21",
            b"\x30\x31",
            b"\x40\x41\x42\x43",
            b"\x50\x51\x52\x53\x54\x55\x56\x57",
            b"\x60\x61\x62\x63\x64\x65\x66\x67\x68\x69\x6a\x6b\x6c\x6d\x6e\x6f",
        ];
        let l: Vec<Hash> = data.iter().map(|d| leaf_hash(d)).collect();
        assert_eq!(
            hex::encode(root(&l)),
            "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328"
        );
    }
}
