//! Opening a sealed model at load: every chunk read once and decrypted in place, in parallel,
//! into the memory the loader parses and the backends upload from; the per-file values (block
//! hashes at plaintext offsets, `crate::model::digest`) and the model digest are computed from
//! those decrypted bytes before anything uses them. No plaintext
//! is written anywhere but these buffers, which are zeroized when dropped (also on failure),
//! and, with [`open_sealed_streaming`], what the sink copies each authenticated chunk to (the
//! CUDA backend: the GPU, whose copy becomes weights only once the whole model passed).

use std::os::unix::fs::FileExt;
use std::path::Path;

use indicatif::ProgressBar;
use rayon::prelude::*;

use super::chunk::{FileCipher, TAG_LEN, chunk_count, sealed_len};
use super::error::SealError;
use super::key::ModelKey;
use super::manifest::{Manifest, SEALED_SUFFIX};
use crate::model::buffer::HostBuffer;
use crate::model::digest::file_value_of;
use crate::model::{BlockSink, FileBytes, ModelFiles};

/// Decrypts the sealed model in `dir` with `key`. Fails (zeroizing everything decrypted so
/// far) on a wrong key, a file of the wrong length, a chunk that does not authenticate, or a
/// file or model digest that differs from the manifest's.
pub fn open_sealed(dir: &Path, key: &ModelKey) -> Result<(Manifest, ModelFiles), SealError> {
    open_sealed_reporting(dir, key, &ProgressBar::hidden())
}

/// [`open_sealed`], advancing `progress` by the plaintext bytes of each chunk decrypted (its
/// length is set to the plaintext total first).
pub fn open_sealed_reporting(
    dir: &Path,
    key: &ModelKey,
    progress: &ProgressBar,
) -> Result<(Manifest, ModelFiles), SealError> {
    open_sealed_inner(dir, key, progress, None)
}

/// [`open_sealed_reporting`], handing each chunk to `sink` right after it was decrypted and
/// authenticated (before the whole model's digest is checked: a model that then fails the
/// check is refused, and what the sink did with it is never used).
pub fn open_sealed_streaming(
    dir: &Path,
    key: &ModelKey,
    progress: &ProgressBar,
    sink: &dyn BlockSink,
) -> Result<(Manifest, ModelFiles), SealError> {
    open_sealed_inner(dir, key, progress, Some(sink))
}

fn open_sealed_inner(
    dir: &Path,
    key: &ModelKey,
    progress: &ProgressBar,
    sink: Option<&dyn BlockSink>,
) -> Result<(Manifest, ModelFiles), SealError> {
    let (manifest, header_digest) = Manifest::read(dir)?;
    if key.id() != manifest.key_id {
        return Err(SealError::WrongKey {
            expected: manifest.key_id.clone(),
            actual: key.id(),
        });
    }
    let salt = manifest.salt_bytes();
    let chunk_size = manifest.chunk_size;

    let mut sources = Vec::with_capacity(manifest.files.len());
    for file in &manifest.files {
        let path = dir.join(format!("{}{SEALED_SUFFIX}", file.name));
        let handle = crate::model::files::open_regular(&path).map_err(SealError::io(&path))?;
        let actual = handle.metadata().map_err(SealError::io(&path))?.len();
        let expected = sealed_len(file.size, chunk_size);
        if actual != expected {
            return Err(SealError::Length {
                path,
                expected,
                actual,
            });
        }
        let size = usize::try_from(file.size).map_err(|_| SealError::Length {
            path: path.clone(),
            expected,
            actual,
        })?;
        sources.push((
            path,
            handle,
            FileCipher::new(key, &salt, header_digest, &file.name),
            size,
        ));
    }

    progress.set_length(manifest.files.iter().map(|f| f.size).sum());
    if let Some(sink) = sink {
        let files: Vec<(&str, usize)> = manifest
            .files
            .iter()
            .zip(&sources)
            .map(|(file, (_, _, _, size))| (file.name.as_str(), *size))
            .collect();
        sink.begin(&files);
    }
    // Decrypt: one task per chunk, each reading its ciphertext straight into its place in the
    // file's plaintext buffer and opening it there.
    let mut buffers = sources
        .iter()
        .map(|(path, _, _, size)| HostBuffer::secret(*size).map_err(SealError::io(path)))
        .collect::<Result<Vec<_>, SealError>>()?;
    buffers
        .par_iter_mut()
        .zip(&sources)
        .enumerate()
        .try_for_each(|(file_index, (buffer, (path, handle, cipher, size)))| {
            let chunks = chunk_count(*size as u64, chunk_size);
            let open = |index: u64, plain: &mut [u8]| {
                let offset = index * (chunk_size + TAG_LEN as u64);
                let mut tag = [0u8; TAG_LEN];
                handle
                    .read_exact_at(plain, offset)
                    .and_then(|()| handle.read_exact_at(&mut tag, offset + plain.len() as u64))
                    .map_err(SealError::io(path))?;
                if cipher.open(index, index + 1 == chunks, plain, &tag) {
                    if let Some(sink) = sink {
                        sink.block(file_index, (index * chunk_size) as usize, plain);
                    }
                    progress.inc(plain.len() as u64);
                    Ok(())
                } else {
                    Err(SealError::Chunk {
                        path: path.clone(),
                        index,
                    })
                }
            };
            if *size == 0 {
                return open(0, &mut []);
            }
            buffer
                .as_mut_slice()
                .par_chunks_mut(chunk_size as usize)
                .enumerate()
                .try_for_each(|(index, plain)| open(index as u64, plain))
        })?;

    // Hash the decrypted bytes, one task per 16 MiB block of plaintext (the digest's blocks, at
    // plaintext offsets, whatever the chunk size), and compare with the manifest.
    let values: Vec<String> = buffers
        .par_iter()
        .map(|buffer| file_value_of(buffer.as_slice()))
        .collect();
    for (file, actual) in manifest.files.iter().zip(&values) {
        if *actual != file.digest {
            return Err(SealError::Digest {
                what: format!("file {}", file.name),
                expected: file.digest.clone(),
                actual: actual.clone(),
            });
        }
    }
    let parts = manifest
        .files
        .iter()
        .zip(buffers)
        .zip(values)
        .map(|((file, buffer), value)| (file.name.clone(), FileBytes::new(buffer), value))
        .collect();
    let files = ModelFiles::from_parts(dir.to_path_buf(), parts);
    if files.digest().hex != manifest.model_digest {
        return Err(SealError::Digest {
            what: "model".into(),
            expected: manifest.model_digest.clone(),
            actual: files.digest().hex.clone(),
        });
    }
    Ok((manifest, files))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seal::chunk::FileCipher;
    use crate::seal::manifest::{
        ALGORITHM, FORMAT, MANIFEST_FILE, ReleaseRequirements, SealedFile, VERSION,
    };

    /// A sealer that lies: the manifest promises a SHA-256 the sealed plaintext does not have.
    /// Every chunk authenticates; the digest check refuses the model.
    #[test]
    fn a_plaintext_whose_digest_differs_from_the_manifest_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let key = ModelKey::from_bytes([5; 32]);
        let salt = [6u8; 32];
        let plain = b"the real contents".to_vec();
        let mut manifest = Manifest {
            format: FORMAT.into(),
            version: VERSION,
            algorithm: ALGORITHM.into(),
            chunk_size: 4096,
            key_id: key.id(),
            salt: hex::encode(salt),
            model_digest: String::new(),
            files: vec![SealedFile {
                name: "config.json".into(),
                size: plain.len() as u64,
                digest: crate::model::digest::file_value_of(b"other"),
            }],
            release: ReleaseRequirements::default(),
            wrapped_key: None,
        };
        manifest.model_digest = manifest.implied_digest().hex;
        let bytes = manifest.to_bytes();
        std::fs::write(dir.path().join(MANIFEST_FILE), &bytes).unwrap();
        let (_, header) = Manifest::parse(Path::new("m"), &bytes).unwrap();
        let cipher = FileCipher::new(&key, &salt, header, "config.json");
        let mut sealed = plain.clone();
        let tag = cipher.seal(0, true, &mut sealed);
        sealed.extend_from_slice(&tag);
        std::fs::write(dir.path().join("config.json.sealed"), &sealed).unwrap();

        let err = open_sealed(dir.path(), &key).unwrap_err();
        assert!(matches!(err, SealError::Digest { .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with("model digest mismatch: file config.json"),
            "{err}"
        );
    }
}
