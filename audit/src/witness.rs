//! The witness: countersigns a log checkpoint only if it is consistent with the last checkpoint
//! the witness cosigned (the add-checkpoint semantics of `c2sp.org/tlog-witness`), so that a log
//! cannot be rolled back, truncated or forked without the witness refusing.
//!
//! The witness state file is `inferno-witness-state/v1\n` followed by the last cosigned
//! checkpoint note. It is replaced atomically (write, fsync, rename, fsync directory).

use std::io::Write as _;
use std::path::Path;

use crate::merkle::verify_consistency;
use crate::note::{Checkpoint, NoteSigner, SignedNote, VerifierKey};
use crate::proof_file::ConsistencyProof;

const STATE_MAGIC: &str = "inferno-witness-state/v1\n";

/// Why the witness refused to cosign. The HTTP status of the equivalent tlog-witness answer is
/// given for each.
#[derive(Debug, thiserror::Error)]
pub enum WitnessError {
    /// The checkpoint is not signed by the log key (403).
    #[error("checkpoint signature: {0}")]
    Signature(#[from] crate::note::NoteError),
    /// The checkpoint is for another log (404).
    #[error("checkpoint origin {got:?} is not the witnessed log {want:?}")]
    UnknownOrigin {
        /// The checkpoint's origin.
        got: String,
        /// The witnessed origin.
        want: String,
    },
    /// The proof starts from a size other than the witness's (409); it carries the witness size.
    #[error("proof starts at size {claimed} but the witness is at size {have}")]
    Conflict {
        /// The size the proof starts from.
        claimed: u64,
        /// The witness's size.
        have: u64,
    },
    /// The checkpoint is older than the witness's (400): a rollback or truncation.
    #[error("rollback: checkpoint size {new} is below the witnessed size {have}")]
    Rollback {
        /// The checkpoint's size.
        new: u64,
        /// The witness's size.
        have: u64,
    },
    /// The checkpoint does not extend the witnessed tree (422): a fork.
    #[error("fork: {0}")]
    Fork(String),
    /// There is no state and first use was not explicitly allowed.
    #[error("the witness has no state yet; pass --init to trust this first checkpoint")]
    NoState,
    /// The state or an input could not be read or written.
    #[error("{0}")]
    Io(String),
}

/// The checkpoint a witness last cosigned.
#[derive(Debug, Clone)]
pub struct WitnessState {
    /// The cosigned note.
    pub note: SignedNote,
    /// Its checkpoint.
    pub checkpoint: Checkpoint,
}

/// Reads the witness state file (`None` if it does not exist).
pub fn load_state(path: &Path) -> Result<Option<WitnessState>, WitnessError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(WitnessError::Io(format!("{}: {e}", path.display()))),
    };
    let body = text
        .strip_prefix(STATE_MAGIC)
        .ok_or_else(|| WitnessError::Io(format!("{}: not a witness state file", path.display())))?;
    let note = SignedNote::parse(body)?;
    let checkpoint = note.checkpoint()?;
    Ok(Some(WitnessState { note, checkpoint }))
}

/// Atomically replaces the witness state file.
pub fn store_state(path: &Path, note: &SignedNote) -> Result<(), WitnessError> {
    let io = |e: std::io::Error| WitnessError::Io(format!("{}: {e}", path.display()));
    let tmp = path.with_extension("tmp");
    let mut f = crate::fileops::create_private(&tmp).map_err(io)?;
    f.write_all(STATE_MAGIC.as_bytes()).map_err(io)?;
    f.write_all(note.render().as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io)?;
    Ok(())
}

/// Decides whether `note` may be cosigned given the witness `state` and a consistency `proof`
/// from the witness's size. `init` allows trusting a first checkpoint when there is no state.
pub fn check_add(
    state: Option<&WitnessState>,
    note: &SignedNote,
    log_key: &VerifierKey,
    proof: Option<&ConsistencyProof>,
    init: bool,
) -> Result<Checkpoint, WitnessError> {
    log_key.verify(note)?;
    let cp = note.checkpoint()?;
    let Some(state) = state else {
        return if init {
            Ok(cp)
        } else {
            Err(WitnessError::NoState)
        };
    };
    let have = &state.checkpoint;
    if cp.origin != have.origin {
        return Err(WitnessError::UnknownOrigin {
            got: cp.origin,
            want: have.origin.clone(),
        });
    }
    if cp.size < have.size {
        return Err(WitnessError::Rollback {
            new: cp.size,
            have: have.size,
        });
    }
    let empty = ConsistencyProof {
        old: have.size,
        new: cp.size,
        hashes: Vec::new(),
    };
    let proof = match proof {
        Some(p) => p,
        None if cp.size == have.size => &empty,
        None => return Err(WitnessError::Fork("a consistency proof is required".into())),
    };
    if proof.old != have.size {
        return Err(WitnessError::Conflict {
            claimed: proof.old,
            have: have.size,
        });
    }
    if proof.new != cp.size {
        return Err(WitnessError::Fork(format!(
            "proof is for size {} but the checkpoint has size {}",
            proof.new, cp.size
        )));
    }
    verify_consistency(have.size, cp.size, &have.root, &cp.root, &proof.hashes).map_err(|e| {
        WitnessError::Fork(format!("consistency proof from size {}: {e}", have.size))
    })?;
    Ok(cp)
}

/// Checks and cosigns `note`, persists the new state and returns the cosigned note.
pub fn add_checkpoint(
    state_path: &Path,
    witness: &NoteSigner,
    note: &SignedNote,
    log_key: &VerifierKey,
    proof: Option<&ConsistencyProof>,
    init: bool,
    now_unix: u64,
) -> Result<SignedNote, WitnessError> {
    let state = load_state(state_path)?;
    check_add(state.as_ref(), note, log_key, proof, init)?;
    let mut cosigned = note.clone();
    let mine = witness.verifier();
    cosigned
        .signatures
        .retain(|s| !(s.name == mine.name && s.key_hash == mine.key_hash()));
    cosigned
        .signatures
        .push(witness.cosign(&note.text, now_unix));
    store_state(state_path, &cosigned)?;
    Ok(cosigned)
}
