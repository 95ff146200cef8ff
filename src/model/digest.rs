//! The model digest: one SHA-256 that identifies every file of a model directory.
//!
//! Each regular file directly inside the directory is hashed (in parallel); the digest is the
//! SHA-256 of the lines `<name>\t<lowercase hex SHA-256 of the file>\n`, sorted by the bytes of
//! the file name. `docs/model-loading.md` gives the exact definition.

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use rayon::prelude::*;
use ring::digest::{Context, SHA256};

use super::error::ModelError;
use super::source::ModelSource;

/// One file's contribution to the digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDigest {
    /// The file's name inside the model directory.
    pub name: String,
    /// Lowercase hex SHA-256 of the file's contents.
    pub sha256: String,
}

/// The model digest and the per-file hashes it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelDigest {
    /// SHA-256 over the sorted `name\tsha256\n` lines.
    pub bytes: [u8; 32],
    /// The same digest as lowercase hex.
    pub hex: String,
    /// The files covered, sorted by name.
    pub files: Vec<FileDigest>,
}

impl fmt::Display for ModelDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hex)
    }
}

impl ModelDigest {
    /// Combines per-file hashes into the digest.
    pub(crate) fn from_files(mut files: Vec<FileDigest>) -> Self {
        files.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
        let mut ctx = Context::new(&SHA256);
        for file in &files {
            ctx.update(file.name.as_bytes());
            ctx.update(b"\t");
            ctx.update(file.sha256.as_bytes());
            ctx.update(b"\n");
        }
        let mut bytes = [0u8; 32];
        bytes.copy_from_slice(ctx.finish().as_ref());
        Self {
            bytes,
            hex: hex::encode(bytes),
            files,
        }
    }

    /// Hashes every regular file (following symbolic links) directly inside `dir`: the
    /// reference computation a client can run on its own copy of a model. (Loading a model
    /// computes the same value from the bytes it loads: `ModelFiles`.)
    pub fn of_dir(dir: &Path) -> Result<Self, ModelError> {
        let files = super::files::list_files(dir)?
            .into_par_iter()
            .map(|(name, path)| {
                let sha256 = hash_file(&path)?;
                Ok(FileDigest { name, sha256 })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Self::from_files(files))
    }

    /// Hashes named in-memory files exactly as [`ModelDigest::of_dir`] hashes a directory
    /// holding them.
    pub fn of_memory(files: &[(&str, &[u8])]) -> Self {
        let files = files
            .par_iter()
            .map(|(name, bytes)| FileDigest {
                name: (*name).to_owned(),
                sha256: hex::encode(ring::digest::digest(&SHA256, bytes)),
            })
            .collect();
        Self::from_files(files)
    }

    /// The digest of a model's files, wherever they come from.
    pub(crate) fn of_source(source: &ModelSource<'_>) -> Result<Self, ModelError> {
        match source {
            ModelSource::Files(files) => Ok(files.digest().clone()),
            ModelSource::Memory(files) => {
                let files: Vec<(&str, &[u8])> = files.iter().map(|(n, b)| (*n, *b)).collect();
                Ok(Self::of_memory(&files))
            }
        }
    }
}

/// Streams a file through SHA-256.
fn hash_file(path: &Path) -> Result<String, ModelError> {
    let io = |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(io)?;
    let mut ctx = Context::new(&SHA256);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        ctx.update(&buf[..n]);
    }
    Ok(hex::encode(ctx.finish()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha256_hex(bytes: &[u8]) -> String {
        hex::encode(ring::digest::digest(&SHA256, bytes))
    }

    #[test]
    fn digest_is_sha256_of_sorted_lines() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.json"), b"{}").unwrap();
        std::fs::write(dir.path().join("a.bin"), b"abc").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/ignored"), b"x").unwrap();

        let digest = ModelDigest::of_dir(dir.path()).unwrap();
        let lines = format!(
            "a.bin\t{}\nb.json\t{}\n",
            sha256_hex(b"abc"),
            sha256_hex(b"{}")
        );
        assert_eq!(digest.hex, sha256_hex(lines.as_bytes()));
        assert_eq!(hex::encode(digest.bytes), digest.hex);
        assert_eq!(digest.files.len(), 2);
        assert_eq!(digest.files[0].name, "a.bin");
        assert_eq!(
            digest.files[0].sha256,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );

        let in_memory = ModelDigest::of_memory(&[("b.json", b"{}"), ("a.bin", b"abc")]);
        assert_eq!(in_memory, digest);
    }

    #[test]
    fn any_content_change_changes_the_digest() {
        let a = ModelDigest::of_memory(&[("x", b"1")]);
        assert_ne!(a, ModelDigest::of_memory(&[("x", b"2")]));
        assert_ne!(a, ModelDigest::of_memory(&[("y", b"1")]));
        assert_ne!(a, ModelDigest::of_memory(&[("x", b"1"), ("z", b"")]));
    }
}
