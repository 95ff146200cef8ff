//! The few file operations the writer performs, behind a trait so that tests can inject
//! faults (a full disk, an I/O error) at any point.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
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
            .mode(PRIVATE_FILE_MODE)
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

/// The mode of every file the audit log writes, whatever the umask: owner read and write.
pub(crate) const PRIVATE_FILE_MODE: u32 = 0o600;
/// The mode of the log directory, whatever the umask: owner only.
pub(crate) const PRIVATE_DIR_MODE: u32 = 0o700;

/// Creates (truncating) a file of the log with [`PRIVATE_FILE_MODE`].
pub(crate) fn create_private(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(PRIVATE_FILE_MODE)
        .open(path)
}

/// Creates `dir` (and its parents) with [`PRIVATE_DIR_MODE`], and takes group and other access
/// away from an existing `dir` and the files directly in it (a log written under a lax umask).
pub(crate) fn make_private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE_DIR_MODE)
        .create(dir)?;
    restrict(dir, PRIVATE_DIR_MODE)?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            restrict(&entry.path(), PRIVATE_FILE_MODE)?;
        }
    }
    Ok(())
}

/// Clears the group and other bits of `path` when any is set, keeping at most `mode`.
fn restrict(path: &Path, mode: u32) -> std::io::Result<()> {
    let current = std::fs::metadata(path)?.permissions().mode() & 0o777;
    if current & 0o077 != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(current & mode))?;
    }
    Ok(())
}
