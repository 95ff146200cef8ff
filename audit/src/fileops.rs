//! The few file operations the writer performs, behind a trait so that tests can inject
//! faults (a full disk, an I/O error) at any point.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::Path;

/// A file the writer appends to.
pub trait AppendFile: Send {
    /// Writes all of `buf` at the end of the file.
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()>;
    /// Makes everything written so far durable (`fdatasync`).
    fn sync(&mut self) -> std::io::Result<()>;
}

/// The file system operations of the writer and of recovery.
pub trait FileOps: Send + Sync {
    /// Creates a new file (failing if it exists) for appending.
    fn create_new(&self, path: &Path) -> std::io::Result<Box<dyn AppendFile>>;
    /// Opens an existing file for appending.
    fn open_append(&self, path: &Path) -> std::io::Result<Box<dyn AppendFile>>;
    /// Truncates a file to `len` bytes and makes that durable.
    fn truncate(&self, path: &Path, len: u64) -> std::io::Result<()>;
    /// Removes a file.
    fn remove(&self, path: &Path) -> std::io::Result<()>;
    /// Makes directory entries (created or removed files) durable.
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()>;
}

/// The real file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct StdFileOps;

struct StdAppendFile(File);

impl AppendFile for StdAppendFile {
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.0.write_all(buf)
    }

    fn sync(&mut self) -> std::io::Result<()> {
        self.0.sync_data()
    }
}

impl FileOps for StdFileOps {
    fn create_new(&self, path: &Path) -> std::io::Result<Box<dyn AppendFile>> {
        let f = OpenOptions::new()
            .append(true)
            .create_new(true)
            .open(path)?;
        Ok(Box::new(StdAppendFile(f)))
    }

    fn open_append(&self, path: &Path) -> std::io::Result<Box<dyn AppendFile>> {
        let f = OpenOptions::new().append(true).open(path)?;
        Ok(Box::new(StdAppendFile(f)))
    }

    fn truncate(&self, path: &Path, len: u64) -> std::io::Result<()> {
        let f = OpenOptions::new().write(true).open(path)?;
        f.set_len(len)?;
        f.sync_all()
    }

    fn remove(&self, path: &Path) -> std::io::Result<()> {
        std::fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        File::open(dir)?.sync_all()
    }
}
