//! Reading a log directory without opening it for writing: its records, its stored checkpoints
//! and its Merkle tree (for proofs).

use std::path::Path;

use crate::error::AuditError;
use crate::merkle::{Frontier, Hash};
use crate::record::Record;
use crate::scan::{ScanFault, read_checkpoints, scan_segments};

/// A record as stored: decoded, with the exact bytes its leaf hash covers.
#[derive(Debug, Clone)]
pub struct StoredRecord {
    /// The decoded record.
    pub record: Record,
    /// The stored payload bytes.
    pub payload: Vec<u8>,
}

fn damaged(fault: &ScanFault) -> AuditError {
    AuditError::Corrupt {
        location: fault.location.to_string(),
        reason: format!("record {}: {}", fault.index, fault.kind),
    }
}

/// Every intact record of the log in `dir`, in order. A torn tail (an interrupted final write)
/// is left out; any other damage is an error (run [`crate::verify`] for the full verdict).
pub fn read_records(dir: &Path) -> Result<Vec<StoredRecord>, AuditError> {
    let mut out = Vec::new();
    let log = scan_segments(dir, |_, _, payload| {
        let record = Record::decode(payload).map_err(|e| format!("not a valid record: {e}"))?;
        out.push(StoredRecord {
            record,
            payload: payload.to_vec(),
        });
        Ok(())
    })?;
    match log.fault.filter(|f| !f.torn_tail) {
        Some(fault) => Err(damaged(&fault)),
        None => Ok(out),
    }
}

/// The signed checkpoints (note texts) stored in the log in `dir`, oldest first; a torn final
/// write is left out, any other damage is an error.
pub fn stored_checkpoints(dir: &Path) -> Result<Vec<String>, AuditError> {
    let file = read_checkpoints(dir)?;
    if let Some(fault) = file.fault.filter(|f| !f.torn_tail) {
        return Err(damaged(&fault));
    }
    Ok(file.checkpoints.into_iter().map(|c| c.note).collect())
}

/// The leaf hashes of an intact log with its pruned prefix, for proofs (see
/// [`crate::merkle::TreeView`]). A torn tail is left out; any other damage is an error.
pub fn load_tree(dir: &Path) -> Result<(Frontier, Vec<Hash>), AuditError> {
    let log = scan_segments(dir, |_, _, _| Ok(()))?;
    if let Some(fault) = log.fault.filter(|f| !f.torn_tail) {
        return Err(damaged(&fault));
    }
    Ok((log.prefix, log.leaves))
}
