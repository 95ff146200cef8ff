//! Cross-implementation vectors (issue 14): the audit log's Merkle tree (RFC 9162 leaf and node
//! hashes, roots, inclusion and consistency proofs) and its C2SP signed checkpoints against Go's
//! `golang.org/x/mod/sumdb/tlog` and `sumdb/note`. The vectors were computed by
//! `audit/testdata/interop/gen.go` (regenerate with `scripts/interop-vectors.sh`); this test
//! needs no Go.

use inferno_audit::merkle::{
    self, Hash, consistency_proof, inclusion_proof, leaf_hash, verify_consistency, verify_inclusion,
};
use inferno_audit::note::{ALG_ED25519, Checkpoint, NoteSigner, SignedNote, VerifierKey};
use serde_json::Value;

fn vectors() -> Value {
    let text = include_str!("../testdata/interop/vectors.json");
    serde_json::from_str(text).expect("vectors parse")
}

fn hash(value: &Value) -> Hash {
    let bytes = hex::decode(value.as_str().expect("hex string")).expect("hex");
    bytes.try_into().expect("32 bytes")
}

fn hashes(value: &Value) -> Vec<Hash> {
    value.as_array().expect("array").iter().map(hash).collect()
}

fn number(value: &Value) -> u64 {
    value.as_u64().expect("number")
}

fn leaves(v: &Value) -> Vec<Hash> {
    let data: Vec<Vec<u8>> = v["leaves"]
        .as_array()
        .expect("leaves")
        .iter()
        .map(|d| hex::decode(d.as_str().expect("hex")).expect("hex"))
        .collect();
    let ours: Vec<Hash> = data.iter().map(|d| leaf_hash(d)).collect();
    assert_eq!(ours, hashes(&v["leaf_hashes"]), "leaf hashes");
    ours
}

#[test]
fn roots_match_go_tlog() {
    let v = vectors();
    let leaves = leaves(&v);
    let roots = v["roots"].as_array().expect("roots");
    assert_eq!(roots.len(), leaves.len());
    for r in roots {
        let size = number(&r["size"]) as usize;
        assert_eq!(
            merkle::root(&leaves[..size]),
            hash(&r["root"]),
            "root of {size}"
        );
    }
}

#[test]
fn inclusion_proofs_match_go_tlog_both_ways() {
    let v = vectors();
    let leaves = leaves(&v);
    let cases = v["inclusion"].as_array().expect("inclusion");
    assert!(cases.len() > 40);
    for case in cases {
        let (index, size) = (number(&case["index"]), number(&case["size"]));
        let theirs = hashes(&case["proof"]);
        let ours = inclusion_proof(index, &leaves[..size as usize]).expect("our proof");
        assert_eq!(ours, theirs, "inclusion of {index} in {size}");
        let root = merkle::root(&leaves[..size as usize]);
        verify_inclusion(index, size, &leaves[index as usize], &theirs, &root)
            .unwrap_or_else(|e| panic!("their proof of {index} in {size}: {e}"));
        if let Some((first, rest)) = theirs.split_first() {
            let mut bad = vec![[first[0] ^ 1; 32]];
            bad.extend_from_slice(rest);
            assert!(verify_inclusion(index, size, &leaves[index as usize], &bad, &root).is_err());
        }
    }
}

#[test]
fn consistency_proofs_match_go_tlog_both_ways() {
    let v = vectors();
    let leaves = leaves(&v);
    let cases = v["consistency"].as_array().expect("consistency");
    assert!(cases.len() > 10);
    for case in cases {
        let (old, new) = (number(&case["old"]), number(&case["new"]));
        let theirs = hashes(&case["proof"]);
        let ours = consistency_proof(old, &leaves[..new as usize]).expect("our proof");
        assert_eq!(ours, theirs, "consistency of {old} with {new}");
        let old_root = merkle::root(&leaves[..old as usize]);
        let new_root = merkle::root(&leaves[..new as usize]);
        verify_consistency(old, new, &old_root, &new_root, &theirs)
            .unwrap_or_else(|e| panic!("their proof of {old} -> {new}: {e}"));
    }
}

/// PKCS#8 v1 DER of an Ed25519 key with this seed (RFC 8410).
fn pkcs8_v1(seed: &[u8]) -> Vec<u8> {
    let mut der = hex::decode("302e020100300506032b657004220420").expect("prefix");
    der.extend_from_slice(seed);
    der
}

#[test]
fn signed_checkpoints_match_go_note_both_ways() {
    let v = vectors();
    let note = &v["note"];
    let signed = note["signed"].as_str().expect("signed");
    let name = note["name"].as_str().expect("name");

    // Go's note verifies with our parser and verifier, and its body is our checkpoint.
    let verifier = VerifierKey::parse(note["verifier"].as_str().expect("vkey")).expect("vkey");
    let parsed = SignedNote::parse(signed).expect("their note parses");
    assert_eq!(
        verifier.verify(&parsed).expect("their signature verifies"),
        None
    );
    let checkpoint = parsed.checkpoint().expect("their checkpoint parses");
    let leaves = leaves(&v);
    assert_eq!(checkpoint.origin, name);
    assert_eq!(checkpoint.size, leaves.len() as u64);
    assert_eq!(checkpoint.root, merkle::root(&leaves));
    assert_eq!(checkpoint.body(), note["text"].as_str().expect("text"));

    // Ed25519 is deterministic: signing the same checkpoint with the same seed must give Go's
    // bytes exactly, so Go's note.Open accepts what we write.
    let seed = hex::decode(note["seed"].as_str().expect("seed")).expect("hex");
    let signer = NoteSigner::from_pkcs8(name, ALG_ED25519, &pkcs8_v1(&seed)).expect("signer");
    assert_eq!(
        signer.verifier().render(),
        note["verifier"].as_str().expect("vkey")
    );
    let ours = signer.sign_checkpoint(&Checkpoint {
        origin: name.to_owned(),
        size: checkpoint.size,
        root: checkpoint.root,
    });
    assert_eq!(ours.render(), signed);

    // A flipped byte in their text is refused.
    let forged = signed.replacen(&format!("\n{}\n", leaves.len()), "\n40\n", 1);
    assert_ne!(forged, signed);
    let forged = SignedNote::parse(&forged).expect("still well formed");
    assert!(verifier.verify(&forged).is_err());
}
