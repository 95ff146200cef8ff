//! Property tests of the RFC 9162 Merkle proofs.

use inferno_audit::merkle::{
    Hash, consistency_proof, inclusion_proof, leaf_hash, root, verify_consistency, verify_inclusion,
};
use proptest::prelude::*;

fn leaves(n: usize, salt: u8) -> Vec<Hash> {
    (0..n)
        .map(|i| leaf_hash(&[&(i as u64).to_le_bytes()[..], &[salt]].concat()))
        .collect()
}

proptest! {
    #[test]
    fn inclusion_proofs_verify_and_bind_the_leaf(n in 1usize..300, pick in any::<prop::sample::Index>(), flip in any::<prop::sample::Index>()) {
        let l = leaves(n, 0);
        let i = pick.index(n);
        let r = root(&l);
        let proof = inclusion_proof(i as u64, &l).expect("proof");
        prop_assert!(verify_inclusion(i as u64, n as u64, &l[i], &proof, &r).is_ok());
        // Another leaf, another index or a damaged proof does not verify.
        prop_assert!(verify_inclusion(i as u64, n as u64, &leaf_hash(b"other"), &proof, &r).is_err());
        if n > 1 {
            let j = (i + 1) % n;
            prop_assert!(verify_inclusion(j as u64, n as u64, &l[i], &proof, &r).is_err());
        }
        if !proof.is_empty() {
            let mut bad = proof.clone();
            let k = flip.index(bad.len());
            bad[k][0] ^= 1;
            prop_assert!(verify_inclusion(i as u64, n as u64, &l[i], &bad, &r).is_err());
            bad.pop();
            prop_assert!(verify_inclusion(i as u64, n as u64, &l[i], &bad, &r).is_err());
        }
    }

    #[test]
    fn consistency_proofs_verify_and_detect_forks(new in 1usize..300, old_pick in any::<prop::sample::Index>(), fork_pick in any::<prop::sample::Index>()) {
        let l = leaves(new, 0);
        let old = old_pick.index(new) + 1;
        let (old_root, new_root) = (root(&l[..old]), root(&l));
        let proof = consistency_proof(old as u64, &l).expect("proof");
        prop_assert!(verify_consistency(old as u64, new as u64, &old_root, &new_root, &proof).is_ok());
        // A log that rewrote any leaf of the old tree (a fork) is not consistent with it.
        let mut forked = l.clone();
        let f = fork_pick.index(old);
        forked[f] = leaf_hash(b"forged");
        let forked_root = root(&forked);
        let forked_proof = consistency_proof(old as u64, &forked).expect("proof");
        prop_assert!(verify_consistency(old as u64, new as u64, &old_root, &forked_root, &forked_proof).is_err());
        if old < new {
            // Claiming the proof for a different old size fails.
            prop_assert!(verify_consistency(old as u64 + 1, new as u64, &root(&l[..old + 1]), &new_root, &proof).is_err() || proof.is_empty());
            // A damaged proof fails.
            let mut bad = proof.clone();
            if let Some(h) = bad.first_mut() {
                h[31] ^= 0x80;
                prop_assert!(verify_consistency(old as u64, new as u64, &old_root, &new_root, &bad).is_err());
            }
        }
    }
}

#[test]
fn rollback_is_not_consistent() {
    let l = leaves(10, 0);
    assert!(verify_consistency(10, 7, &root(&l), &root(&l[..7]), &[]).is_err());
}
