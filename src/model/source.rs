//! Where a model's files come from: a directory (plain or sealed) read into memory, or byte
//! slices compiled into the binary.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::ModelError;
use super::files::{FileBytes, ModelFiles};

/// The origin of a model's files.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ModelSource<'a> {
    /// A Hugging Face model directory, read into memory (and hashed) in one pass.
    Files(&'a ModelFiles),
    /// Named files held in memory for the life of the program.
    Memory(&'a [(&'a str, &'static [u8])]),
}

impl ModelSource<'_> {
    /// The path used to name `file` in errors (for embedded models: `embedded/<file>`).
    pub(crate) fn path(&self, file: &str) -> PathBuf {
        match self {
            Self::Files(files) => files.dir().join(file),
            Self::Memory(_) => Path::new("embedded").join(file),
        }
    }

    /// The contents of `file`, or `None` when it does not exist.
    pub(crate) fn read_optional(&self, file: &str) -> Result<Option<Vec<u8>>, ModelError> {
        match self {
            Self::Files(files) => Ok(files.get(file).map(|bytes| bytes.as_slice().to_vec())),
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

    /// The bytes of `file`, which must exist, without copying them.
    pub(crate) fn bytes(&self, file: &str) -> Result<SourceBytes, ModelError> {
        let found = match self {
            Self::Files(files) => files.get(file).cloned().map(SourceBytes::Shared),
            Self::Memory(files) => find(files, file).map(SourceBytes::Static),
        };
        found.ok_or_else(|| ModelError::MissingFile {
            path: self.path(file),
        })
    }
}

/// A file's bytes, kept for the life of the model without a copy.
pub(crate) enum SourceBytes {
    /// Read (or decrypted) into memory at load.
    Shared(Arc<FileBytes>),
    /// Compiled into the binary.
    Static(&'static [u8]),
}

impl SourceBytes {
    /// The whole file.
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            Self::Shared(bytes) => bytes.as_slice(),
            Self::Static(bytes) => bytes,
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
