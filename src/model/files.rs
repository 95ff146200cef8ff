//! A model directory read once into memory, hashed in the same pass.
//!
//! Every regular file directly inside the directory is read exactly once, by parallel workers
//! (one per file, in 16 MiB blocks); each block is hashed right after it is read, from the very
//! buffer that the loader then parses and the backends upload. There is no second read of the
//! weights, and no window between hashing and use in which the (untrusted) disk could change
//! what is used. A sealed model (`crate::seal`) produces the same structure from its decrypted
//! chunks, with buffers that are zeroized when dropped.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rayon::prelude::*;
use ring::digest::{Context, SHA256};
use zeroize::Zeroize;

use super::digest::{FileDigest, ModelDigest};
use super::error::ModelError;

/// Size of one read (and hash) block.
const READ_BLOCK: usize = 16 << 20;
/// Size of the read past the file's expected end (normally empty: it finds the end of file).
const TAIL_BLOCK: usize = 64 << 10;

/// One file's bytes, held in memory for the life of the model.
pub struct FileBytes {
    bytes: Vec<u8>,
    /// Whether the bytes are secret (decrypted weights): overwritten with zeros when dropped.
    secret: bool,
}

impl FileBytes {
    /// Plaintext read from an ordinary model directory.
    pub(crate) fn public(bytes: Vec<u8>) -> Self {
        Self {
            bytes,
            secret: false,
        }
    }

    /// Decrypted plaintext of a sealed model: zeroized when dropped.
    pub(crate) fn secret(bytes: Vec<u8>) -> Self {
        Self {
            bytes,
            secret: true,
        }
    }

    /// The contents.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for FileBytes {
    fn drop(&mut self) {
        if self.secret {
            self.bytes.zeroize();
        }
    }
}

impl std::fmt::Debug for FileBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileBytes")
            .field("len", &self.bytes.len())
            .field("secret", &self.secret)
            .finish()
    }
}

/// Every file of a model, in memory, with the model digest computed from those same bytes.
#[derive(Debug)]
pub struct ModelFiles {
    /// Where the files came from (names files in errors).
    dir: PathBuf,
    files: BTreeMap<String, Arc<FileBytes>>,
    digest: ModelDigest,
}

impl ModelFiles {
    /// Reads every regular file (following symbolic links) directly inside `dir` once, in
    /// parallel, hashing each block as it is read.
    pub fn read_dir(dir: &Path) -> Result<Self, ModelError> {
        let paths = list_files(dir)?;
        let read = paths
            .into_par_iter()
            .map(|(name, path)| {
                let (bytes, sha256) = read_and_hash(&path)?;
                Ok((name, bytes, sha256))
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Self::from_parts(
            dir.to_path_buf(),
            read.into_iter()
                .map(|(name, bytes, sha256)| (name, FileBytes::public(bytes), sha256))
                .collect(),
        ))
    }

    /// Assembles files whose SHA-256 (lowercase hex) the caller computed from `bytes`.
    pub(crate) fn from_parts(dir: PathBuf, parts: Vec<(String, FileBytes, String)>) -> Self {
        let mut hashes = Vec::with_capacity(parts.len());
        let mut files = BTreeMap::new();
        for (name, bytes, sha256) in parts {
            hashes.push(FileDigest {
                name: name.clone(),
                sha256,
            });
            files.insert(name, Arc::new(bytes));
        }
        Self {
            dir,
            files,
            digest: ModelDigest::from_files(hashes),
        }
    }

    /// The directory the files came from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The model digest of these bytes.
    pub fn digest(&self) -> &ModelDigest {
        &self.digest
    }

    /// The file called `name`, shared.
    pub fn get(&self, name: &str) -> Option<&Arc<FileBytes>> {
        self.files.get(name)
    }

    /// The names of the files, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.files.keys().map(String::as_str)
    }
}

/// The regular files directly inside `dir`, as (name, path), with names usable in the digest.
pub(crate) fn list_files(dir: &Path) -> Result<Vec<(String, PathBuf)>, ModelError> {
    let io = |path: PathBuf| move |source| ModelError::Io { path, source };
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io(dir.to_path_buf()))? {
        let entry = entry.map_err(io(dir.to_path_buf()))?;
        let path = entry.path();
        let metadata = std::fs::metadata(&path).map_err(io(path.clone()))?;
        if metadata.is_file() {
            let name = entry
                .file_name()
                .into_string()
                .ok()
                .filter(|n| !n.contains(['\t', '\n']))
                .ok_or_else(|| ModelError::UnusableFileName { path: path.clone() })?;
            paths.push((name, path));
        }
    }
    paths.sort();
    Ok(paths)
}

/// Reads a whole file, hashing each block right after it lands in the returned buffer.
fn read_and_hash(path: &Path) -> Result<(Vec<u8>, String), ModelError> {
    let io = |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(io)?;
    let expected = file.metadata().map_err(io)?.len();
    let expected = usize::try_from(expected).unwrap_or(0);
    // Room for the whole file plus the final (empty) read, so the buffer is never reallocated.
    let mut bytes = Vec::with_capacity(expected.saturating_add(TAIL_BLOCK));
    let mut ctx = Context::new(&SHA256);
    loop {
        let start = bytes.len();
        let want = if start < expected {
            READ_BLOCK.min(expected - start)
        } else {
            TAIL_BLOCK
        };
        bytes.resize(start + want, 0);
        let mut filled = start;
        // Fill the whole block (short reads happen) or stop at end of file.
        while filled < bytes.len() {
            let n = file.read(&mut bytes[filled..]).map_err(io)?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        bytes.truncate(filled);
        ctx.update(&bytes[start..filled]);
        if filled - start < want {
            break;
        }
    }
    bytes.shrink_to_fit();
    Ok((bytes, hex::encode(ctx.finish())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_pass_digest_equals_the_reference_digest() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.json"), b"{}").unwrap();
        let big: Vec<u8> = (0..READ_BLOCK + 12345).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("a.bin"), &big).unwrap();
        std::fs::write(dir.path().join("empty"), b"").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();

        let files = ModelFiles::read_dir(dir.path()).unwrap();
        assert_eq!(
            files.digest(),
            &ModelDigest::of_dir(dir.path()).unwrap(),
            "the one-pass digest is the documented digest"
        );
        assert_eq!(files.get("a.bin").unwrap().as_slice(), &big[..]);
        assert_eq!(files.get("empty").unwrap().as_slice(), b"");
        assert_eq!(
            files.names().collect::<Vec<_>>(),
            ["a.bin", "b.json", "empty"]
        );
    }
}
