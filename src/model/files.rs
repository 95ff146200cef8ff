//! A model directory read once into memory, hashed in the same pass.
//!
//! Every regular file directly inside the directory is read exactly once, by parallel workers
//! (one task per 16 MiB block of every file, so a few large shards still use every core); each
//! task hashes its block (the digest's block, `digest.rs`) in the very buffer that the loader
//! parses and the backends upload, right after reading it.
//! There is no second read of the weights, and no window between hashing and use in which the
//! (untrusted) disk could change what is used; a file that grows while it is read is refused.
//! A sealed model (`crate::seal`) produces the same structure from its decrypted
//! chunks, with buffers that are zeroized when dropped. The buffers (`buffer.rs`) are advised to
//! use transparent huge pages.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use indicatif::ProgressBar;
use rayon::prelude::*;

use super::buffer::HostBuffer;
use super::digest::{DIGEST_BLOCK, FileDigest, ModelDigest, block_hash, file_value};
use super::error::ModelError;

/// Size of one read block (one parallel task): the digest's block, so each task hashes what
/// it read. Every block starts at a multiple of it in its file.
pub const READ_BLOCK: usize = DIGEST_BLOCK;

/// Receives each block of a model's files right after it was read and checked, from the task
/// that read it: a plaintext block once hashed ([`ModelFiles::read_dir_streaming`]), a sealed
/// chunk once decrypted and authenticated (`crate::seal::open_sealed_streaming`). What it is
/// given are the very bytes the model keeps, so what it copies elsewhere (the CUDA backend
/// copies weight bytes to the GPU while the rest is still being read) is exactly what the
/// digest covers. Each byte of each file is handed over once.
pub trait BlockSink: Sync {
    /// Called once before any block, with every file's name and length.
    fn begin(&self, files: &[(&str, usize)]);
    /// `bytes` of file `file` (an index into `begin`'s list) at byte `offset`.
    fn block(&self, file: usize, offset: usize, bytes: &[u8]);
}

/// One file's bytes, held in memory for the life of the model.
#[derive(Debug)]
pub struct FileBytes {
    buffer: HostBuffer,
}

impl FileBytes {
    /// Bytes read into `buffer` (a secret buffer is wiped when the bytes are dropped).
    pub(crate) fn new(buffer: HostBuffer) -> Self {
        Self { buffer }
    }

    /// The contents.
    pub fn as_slice(&self) -> &[u8] {
        self.buffer.as_slice()
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
    /// Reads every regular file (following symbolic links) directly inside `dir` once, all
    /// files' blocks in parallel, each block hashed by the task that read it into the buffer
    /// the model keeps.
    pub fn read_dir(dir: &Path) -> Result<Self, ModelError> {
        Self::read_dir_reporting(dir, &ProgressBar::hidden())
    }

    /// [`ModelFiles::read_dir`], advancing `progress` by the bytes of each block read (its
    /// length is set to the total first).
    pub fn read_dir_reporting(dir: &Path, progress: &ProgressBar) -> Result<Self, ModelError> {
        Self::read_dir_inner(dir, progress, None)
    }

    /// [`ModelFiles::read_dir_reporting`], handing every block to `sink` right after it was
    /// hashed.
    pub fn read_dir_streaming(
        dir: &Path,
        progress: &ProgressBar,
        sink: &dyn BlockSink,
    ) -> Result<Self, ModelError> {
        Self::read_dir_inner(dir, progress, Some(sink))
    }

    fn read_dir_inner(
        dir: &Path,
        progress: &ProgressBar,
        sink: Option<&dyn BlockSink>,
    ) -> Result<Self, ModelError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ModelError::Io { path, source }
        };
        let mut opened = list_files(dir)?
            .into_iter()
            .map(|(name, path)| {
                let file = open_regular(&path).map_err(io(&path))?;
                let len = file.metadata().map_err(io(&path))?.len();
                let len = usize::try_from(len)
                    .map_err(|_| io(&path)(std::io::Error::other("too large for this machine")))?;
                // Zeroed pages come from the kernel lazily, 2 MiB at a time where it can.
                let bytes = HostBuffer::public(len).map_err(io(&path))?;
                Ok((name, path, file, bytes))
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        progress.set_length(opened.iter().map(|(_, _, _, b)| b.len() as u64).sum());
        if let Some(sink) = sink {
            let files: Vec<(&str, usize)> = opened
                .iter()
                .map(|(name, _, _, bytes)| (name.as_str(), bytes.len()))
                .collect();
            sink.begin(&files);
        }
        // One task per block of every file, so a few large shards use every core; each task
        // hashes its block right after reading it (while it is in the CPU's caches), from the
        // very buffer the loader parses and the backends upload.
        let values = opened
            .par_iter_mut()
            .enumerate()
            .map(|(file_index, (_, path, file, bytes))| {
                let len = bytes.len();
                let hashes = bytes
                    .as_mut_slice()
                    .par_chunks_mut(READ_BLOCK)
                    .enumerate()
                    .map(|(index, block)| {
                        file.read_exact_at(block, (index * READ_BLOCK) as u64)
                            .map_err(io(path))?;
                        let hash = block_hash(block);
                        if let Some(sink) = sink {
                            sink.block(file_index, index * READ_BLOCK, block);
                        }
                        progress.inc(block.len() as u64);
                        Ok(hash)
                    })
                    .collect::<Result<Vec<_>, ModelError>>()?;
                // A file that grew while it was read would be used in part: refuse it.
                let mut probe = [0u8; 1];
                match file.read_at(&mut probe, len as u64) {
                    Ok(0) => Ok(file_value(&hashes)),
                    Ok(_) => Err(io(path)(std::io::Error::other(
                        "the file grew while it was read",
                    ))),
                    Err(e) => Err(io(path)(e)),
                }
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let parts = opened
            .into_iter()
            .zip(values)
            .map(|((name, _, _, bytes), value)| (name, FileBytes::new(bytes), value))
            .collect();
        Ok(Self::from_parts(dir.to_path_buf(), parts))
    }

    /// Assembles files whose values ([`super::digest::file_value`]) the caller computed from
    /// `bytes`.
    pub(crate) fn from_parts(dir: PathBuf, parts: Vec<(String, FileBytes, String)>) -> Self {
        let mut hashes = Vec::with_capacity(parts.len());
        let mut files = BTreeMap::new();
        for (name, bytes, value) in parts {
            hashes.push(FileDigest {
                name: name.clone(),
                value,
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

/// Opens `path` for reading only if it is a regular file (after following links). The open
/// itself does not block (`O_NONBLOCK`: a FIFO, which would wait for a writer forever, opens at
/// once) and anything but a regular file is refused with an `InvalidInput` error before a byte
/// is read. `O_NONBLOCK` has no effect on reading a regular file.
pub fn open_regular(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file (a FIFO, device or directory); refusing to read it",
        ));
    }
    Ok(file)
}

/// Reads the whole of `path`, which must be a regular file ([`open_regular`]).
pub fn read_regular(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut file = open_regular(path)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_pass_digest_equals_the_reference_digest() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.json"), b"{}").unwrap();
        let big: Vec<u8> = (0..2 * READ_BLOCK + 12345)
            .map(|i| (i % 251) as u8)
            .collect();
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

    /// Records what a sink is handed.
    #[derive(Default)]
    struct Recorder {
        files: std::sync::Mutex<Vec<(String, usize)>>,
        blocks: std::sync::Mutex<Vec<(usize, usize, Vec<u8>)>>,
    }

    impl BlockSink for Recorder {
        fn begin(&self, files: &[(&str, usize)]) {
            let mut seen = self.files.lock().unwrap();
            assert!(seen.is_empty(), "begin is called once");
            seen.extend(files.iter().map(|(n, l)| ((*n).to_owned(), *l)));
        }

        fn block(&self, file: usize, offset: usize, bytes: &[u8]) {
            assert!(!self.files.lock().unwrap().is_empty(), "begin comes first");
            self.blocks
                .lock()
                .unwrap()
                .push((file, offset, bytes.to_vec()));
        }
    }

    #[test]
    fn a_streaming_read_hands_every_block_once_with_the_bytes_kept() {
        let dir = tempfile::tempdir().unwrap();
        let big: Vec<u8> = (0..2 * READ_BLOCK + 999).map(|i| (i % 253) as u8).collect();
        std::fs::write(dir.path().join("w.safetensors"), &big).unwrap();
        std::fs::write(dir.path().join("config.json"), b"{}").unwrap();
        let recorder = Recorder::default();
        let files =
            ModelFiles::read_dir_streaming(dir.path(), &ProgressBar::hidden(), &recorder).unwrap();
        assert_eq!(files.digest(), &ModelDigest::of_dir(dir.path()).unwrap());
        let names = recorder.files.into_inner().unwrap();
        assert_eq!(
            names,
            [
                ("config.json".to_owned(), 2),
                ("w.safetensors".to_owned(), big.len())
            ]
        );
        let mut blocks = recorder.blocks.into_inner().unwrap();
        blocks.sort_by_key(|(file, offset, _)| (*file, *offset));
        let layout: Vec<(usize, usize, usize)> =
            blocks.iter().map(|(f, o, b)| (*f, *o, b.len())).collect();
        assert_eq!(
            layout,
            [
                (0, 0, 2),
                (1, 0, READ_BLOCK),
                (1, READ_BLOCK, READ_BLOCK),
                (1, 2 * READ_BLOCK, 999)
            ]
        );
        for (file, offset, bytes) in &blocks {
            let kept = files.get(&names[*file].0).unwrap().as_slice();
            assert_eq!(&kept[*offset..*offset + bytes.len()], &bytes[..]);
        }
    }
}
