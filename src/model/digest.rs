//! The model digest: one SHA-256 that identifies every file of a model directory.
//!
//! A file's value is the SHA-256 of its 16 MiB blocks' hashes (lowercase hex, one per line), so
//! the blocks of one large file are hashed in parallel, each by the task that reads it; the
//! digest is the SHA-256 of the lines `<name>\t<file value>\n`, sorted by the bytes of the file
//! name. `docs/model-loading.md` gives the exact definition and a coreutils recipe.

use std::fmt;
use std::io::Read;
use std::path::Path;

use rayon::prelude::*;
use ring::digest::{Context, SHA256};

use super::error::ModelError;
use super::source::ModelSource;

/// Bytes per hashed block of a file (16 MiB); the last block of a file may be shorter, and an
/// empty file has no block.
pub const DIGEST_BLOCK: usize = 16 << 20;

/// The SHA-256 of one block of a file.
pub fn block_hash(block: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(ring::digest::digest(&SHA256, block).as_ref());
    out
}

/// A file's value from its blocks' hashes, in file order: the lowercase hex SHA-256 of the
/// concatenated lines `<lowercase hex block hash>\n`.
pub fn file_value(block_hashes: &[[u8; 32]]) -> String {
    let mut ctx = Context::new(&SHA256);
    for hash in block_hashes {
        ctx.update(hex::encode(hash).as_bytes());
        ctx.update(b"\n");
    }
    hex::encode(ctx.finish())
}

/// The value of a file held in memory, its blocks hashed in parallel.
pub fn file_value_of(bytes: &[u8]) -> String {
    let hashes: Vec<[u8; 32]> = bytes.par_chunks(DIGEST_BLOCK).map(block_hash).collect();
    file_value(&hashes)
}

/// The value of whatever `reader` yields up to its end, read block by block; `on_read` is told
/// how many bytes each read returned. Returns the length read and the value.
pub(crate) fn stream_file_value(
    reader: &mut impl Read,
    mut on_read: impl FnMut(usize),
) -> std::io::Result<(u64, String)> {
    let mut hashes = Vec::new();
    let mut block = zeroize::Zeroizing::new(vec![0u8; DIGEST_BLOCK]);
    let mut total = 0u64;
    loop {
        let mut filled = 0;
        while filled < DIGEST_BLOCK {
            match reader.read(&mut block[filled..]) {
                Ok(0) => break,
                Ok(n) => {
                    filled += n;
                    on_read(n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if filled == 0 {
            break;
        }
        total += filled as u64;
        hashes.push(block_hash(&block[..filled]));
        if filled < DIGEST_BLOCK {
            break;
        }
    }
    Ok((total, file_value(&hashes)))
}

/// One file's contribution to the digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDigest {
    /// The file's name inside the model directory.
    pub name: String,
    /// The file's value ([`file_value`]): lowercase hex SHA-256 of its block hashes.
    pub value: String,
}

/// The model digest and the per-file values it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelDigest {
    /// SHA-256 over the sorted `name\tvalue\n` lines.
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
    /// Combines per-file values into the digest.
    pub(crate) fn from_files(mut files: Vec<FileDigest>) -> Self {
        files.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
        let mut ctx = Context::new(&SHA256);
        for file in &files {
            ctx.update(file.name.as_bytes());
            ctx.update(b"\t");
            ctx.update(file.value.as_bytes());
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

    /// Hashes every regular file (following symbolic links) directly inside `dir`, streaming
    /// each one block by block: the reference computation a client can run on its own copy of
    /// a model. (Loading a model computes the same value from the bytes it loads, hashing each
    /// block as it is read: `ModelFiles`.)
    pub fn of_dir(dir: &Path) -> Result<Self, ModelError> {
        let files = super::files::list_files(dir)?
            .into_par_iter()
            .map(|(name, path)| {
                let io = |source| ModelError::Io {
                    path: path.clone(),
                    source,
                };
                let mut file = super::files::open_regular(&path).map_err(io)?;
                let (_, value) = stream_file_value(&mut file, |_| {}).map_err(io)?;
                Ok(FileDigest { name, value })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Self::from_files(files))
    }

    /// Hashes named in-memory files exactly as [`ModelDigest::of_dir`] hashes a directory
    /// holding them.
    pub fn of_memory(files: &[(&str, &[u8])]) -> Self {
        let files = files
            .iter()
            .map(|(name, bytes)| FileDigest {
                name: (*name).to_owned(),
                value: file_value_of(bytes),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sha256_hex(bytes: &[u8]) -> String {
        hex::encode(ring::digest::digest(&SHA256, bytes))
    }

    /// The value of a file of at most one block: the SHA-256 of its hash's hex line.
    fn one_block_value(bytes: &[u8]) -> String {
        sha256_hex(format!("{}\n", sha256_hex(bytes)).as_bytes())
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
            one_block_value(b"abc"),
            one_block_value(b"{}")
        );
        assert_eq!(digest.hex, sha256_hex(lines.as_bytes()));
        assert_eq!(hex::encode(digest.bytes), digest.hex);
        assert_eq!(digest.files.len(), 2);
        assert_eq!(digest.files[0].name, "a.bin");
        // printf abc | sha256sum | cut -d' ' -f1 | sha256sum
        assert_eq!(
            digest.files[0].value,
            "620a3df236da0af638c2a61c86951463731998f91dbb3ed629f47b9fe00ad118"
        );

        let in_memory = ModelDigest::of_memory(&[("b.json", b"{}"), ("a.bin", b"abc")]);
        assert_eq!(in_memory, digest);
    }

    #[test]
    fn a_file_value_hashes_its_blocks_hashes_and_an_empty_file_has_none() {
        let bytes: Vec<u8> = (0..2 * DIGEST_BLOCK + 5).map(|i| (i % 253) as u8).collect();
        let lines: String = bytes
            .chunks(DIGEST_BLOCK)
            .map(|b| format!("{}\n", sha256_hex(b)))
            .collect();
        assert_eq!(lines.lines().count(), 3);
        assert_eq!(file_value_of(&bytes), sha256_hex(lines.as_bytes()));
        let (len, streamed) = stream_file_value(&mut &bytes[..], |_| {}).unwrap();
        assert_eq!(len, bytes.len() as u64);
        assert_eq!(streamed, file_value_of(&bytes));
        let exact = &bytes[..DIGEST_BLOCK];
        assert_eq!(file_value_of(exact), one_block_value(exact));
        assert_eq!(file_value_of(b""), sha256_hex(b""));
        assert_eq!(
            stream_file_value(&mut &b""[..], |_| {}).unwrap().1,
            sha256_hex(b"")
        );
    }

    #[test]
    fn any_content_change_changes_the_digest() {
        let a = ModelDigest::of_memory(&[("x", b"1")]);
        assert_ne!(a, ModelDigest::of_memory(&[("x", b"2")]));
        assert_ne!(a, ModelDigest::of_memory(&[("y", b"1")]));
        assert_ne!(a, ModelDigest::of_memory(&[("x", b"1"), ("z", b"")]));
    }
}
