//! The log directory's lock: while a writer has the log open it holds an exclusive advisory
//! lock (`flock`) on [`LOCK_FILE`]. Operations that must not run beside a writer (prune, a
//! second writer) take the same lock and refuse when it is held. The kernel releases the lock
//! when its holder exits, even by `kill -9`, so a stale lock file never blocks anything.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use rustix::fs::{FlockOperation, flock};
use rustix::io::Errno;

/// The lock file's name in the log directory.
pub const LOCK_FILE: &str = "writer.lock";

/// The lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process (or another open log in this one) holds the lock.
    #[error(
        "the audit log in {0} is in use: a running writer (inferno serve) holds its lock file {LOCK_FILE}; stop it first"
    )]
    Busy(PathBuf),
    /// The lock file could not be opened or locked.
    #[error("cannot lock {path}: {source}")]
    Io {
        /// The lock file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// A held lock on a log directory; released when dropped.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

impl DirLock {
    /// Takes the lock of the log in `dir` without waiting (creating the lock file if needed).
    pub fn try_acquire(dir: &Path) -> Result<Self, LockError> {
        let path = dir.join(LOCK_FILE);
        let io = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        let file = OpenOptions::new()
            .mode(crate::fileops::PRIVATE_FILE_MODE)
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io)?;
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Self { _file: file }),
            Err(Errno::WOULDBLOCK) => Err(LockError::Busy(dir.to_path_buf())),
            Err(errno) => Err(io(errno.into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_refuses_a_second_holder_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let held = DirLock::try_acquire(dir.path()).unwrap();
        let err = DirLock::try_acquire(dir.path()).unwrap_err();
        assert!(matches!(err, LockError::Busy(_)), "{err}");
        assert!(err.to_string().contains("in use"), "{err}");
        drop(held);
        DirLock::try_acquire(dir.path()).unwrap();
    }
}
