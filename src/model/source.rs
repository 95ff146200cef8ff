//! Where a model's files come from: a directory on disk, or byte slices compiled into the binary.

use std::path::{Path, PathBuf};

use super::error::ModelError;

/// The origin of a model's files.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ModelSource<'a> {
    /// A Hugging Face model directory.
    Dir(&'a Path),
    /// Named files held in memory for the life of the program.
    Memory(&'a [(&'a str, &'static [u8])]),
}

impl ModelSource<'_> {
    /// The path used to name `file` in errors (for embedded models: `embedded/<file>`).
    pub(crate) fn path(&self, file: &str) -> PathBuf {
        match self {
            Self::Dir(dir) => dir.join(file),
            Self::Memory(_) => Path::new("embedded").join(file),
        }
    }

    /// The contents of `file`, or `None` when it does not exist.
    pub(crate) fn read_optional(&self, file: &str) -> Result<Option<Vec<u8>>, ModelError> {
        match self {
            Self::Dir(dir) => {
                let path = dir.join(file);
                match std::fs::read(&path) {
                    Ok(bytes) => Ok(Some(bytes)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(source) => Err(ModelError::Io { path, source }),
                }
            }
            Self::Memory(files) => Ok(find(files, file).map(<[u8]>::to_vec)),
        }
    }

    /// The contents of `file`, which must exist.
    pub(crate) fn read(&self, file: &str) -> Result<Vec<u8>, ModelError> {
        self.read_optional(file)?
            .ok_or_else(|| ModelError::MissingFile {
                path: self.path(file),
            })
    }

    /// For an embedded model, the bytes of `file` (an error when absent); for a directory,
    /// `None`: the caller opens `self.path(file)` itself (e.g. to memory-map it).
    pub(crate) fn embedded(&self, file: &str) -> Option<Result<&'static [u8], ModelError>> {
        match self {
            Self::Dir(_) => None,
            Self::Memory(files) => Some(find(files, file).ok_or_else(|| ModelError::MissingFile {
                path: self.path(file),
            })),
        }
    }
}

/// The embedded file called `name`.
fn find(files: &[(&str, &'static [u8])], name: &str) -> Option<&'static [u8]> {
    files
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, bytes)| *bytes)
}
