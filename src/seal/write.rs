//! `inferno seal`: seals every file of a model directory, streaming, in parallel.
//!
//! Two passes over the plaintext: the first hashes every file (the manifest, and so every
//! chunk's associated data, carries the per-file values and the model digest), the second
//! encrypts chunk by chunk, each worker reading one chunk at its offset, sealing it and writing
//! it at its place in the output. Memory stays at one chunk per worker. The manifest is written
//! last (via a temporary file and a rename), so an interrupted sealing leaves no manifest.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;
use ring::rand::{SecureRandom, SystemRandom};
use zeroize::Zeroizing;

use super::chunk::{FileCipher, TAG_LEN, chunk_count, sealed_len};
use super::error::SealError;
use super::key::ModelKey;
use super::manifest::{
    ALGORITHM, DEFAULT_CHUNK_SIZE, FORMAT, MANIFEST_FILE, Manifest, ReleaseRequirements,
    SEALED_SUFFIX, SealedFile, VERSION, is_model_file_name,
};
use super::recipient::{RecipientKey, wrap};
use crate::model::digest::stream_file_value;

/// How to seal.
#[derive(Clone)]
pub struct SealOptions {
    /// Plaintext bytes per chunk.
    pub chunk_size: u64,
    /// Release requirements recorded in the manifest.
    pub release: ReleaseRequirements,
    /// Wrap the model key to this key broker's public key in the manifest.
    pub recipient: Option<RecipientKey>,
    /// Draw a progress bar on stderr (only shown when stderr is a terminal).
    pub progress: bool,
}

impl Default for SealOptions {
    fn default() -> Self {
        Self {
            chunk_size: DEFAULT_CHUNK_SIZE,
            release: ReleaseRequirements::default(),
            recipient: None,
            progress: false,
        }
    }
}

/// The mode of every file `inferno seal` writes: ciphertext and the manifest, not secret, but
/// not writable by others (the output directory itself is created 0700).
pub const SEALED_FILE_MODE: u32 = 0o644;

/// Seals every regular file directly inside `model` into `out` (created 0700 if absent; existing
/// sealed files or manifest are never overwritten, and no output is written through a symbolic
/// link) under `key`. Returns the manifest written.
pub fn seal_dir(
    model: &Path,
    out: &Path,
    key: &ModelKey,
    options: &SealOptions,
) -> Result<Manifest, SealError> {
    let inputs = crate::model::files::list_files(model)?;
    if let Some((name, _)) = inputs.iter().find(|(n, _)| !is_model_file_name(n)) {
        return Err(SealError::Manifest {
            path: model.join(name),
            reason: "this file name cannot be sealed".into(),
        });
    }
    if inputs.is_empty() {
        return Err(SealError::Manifest {
            path: model.to_path_buf(),
            reason: "the model directory holds no files".into(),
        });
    }
    super::create_private_dir(out).map_err(SealError::io(out))?;
    let manifest_path = out.join(MANIFEST_FILE);
    if manifest_path.symlink_metadata().is_ok() {
        return Err(SealError::Exists {
            path: manifest_path,
        });
    }

    let total: u64 = inputs
        .iter()
        .map(|(_, path)| std::fs::metadata(path).map(|m| m.len()).unwrap_or(0))
        .sum();
    let bar = progress_bar(options.progress, 2 * total);

    // Pass 1: hash every file.
    bar.set_message("hashing");
    let files = inputs
        .par_iter()
        .map(|(name, path)| {
            let mut file = crate::model::files::open_regular(path).map_err(SealError::io(path))?;
            let (size, digest) =
                stream_file_value(&mut file, |n| bar.inc(n as u64)).map_err(SealError::io(path))?;
            Ok(SealedFile {
                name: name.clone(),
                size,
                digest,
            })
        })
        .collect::<Result<Vec<_>, SealError>>()?;

    let mut salt = [0u8; 32];
    SystemRandom::new()
        .fill(&mut salt)
        .map_err(|_| SealError::Wrap("the system random generator failed".into()))?;
    let mut manifest = Manifest {
        format: FORMAT.to_owned(),
        version: VERSION,
        algorithm: ALGORITHM.to_owned(),
        chunk_size: options.chunk_size,
        key_id: key.id(),
        salt: hex::encode(salt),
        model_digest: String::new(),
        files,
        release: options.release.clone(),
        wrapped_key: options
            .recipient
            .as_ref()
            .map(|r| wrap(key, r))
            .transpose()?,
    };
    manifest.model_digest = manifest.implied_digest().hex;
    let manifest_bytes = manifest.to_bytes();
    // The same checks a reader applies (chunk size bounds, names, hex).
    let (_, header_digest) = Manifest::parse(&manifest_path, &manifest_bytes)?;

    // Pass 2: encrypt.
    bar.set_message("sealing");
    let outputs = manifest
        .files
        .iter()
        .zip(&inputs)
        .map(|(file, (_, input))| {
            let out_path = out.join(format!("{}{SEALED_SUFFIX}", file.name));
            let output =
                super::create_new_file(&out_path, SEALED_FILE_MODE).map_err(|e| {
                    match e.kind() {
                        std::io::ErrorKind::AlreadyExists => SealError::Exists {
                            path: out_path.clone(),
                        },
                        _ => SealError::Io {
                            path: out_path.clone(),
                            source: e,
                        },
                    }
                })?;
            output
                .set_len(sealed_len(file.size, manifest.chunk_size))
                .map_err(SealError::io(&out_path))?;
            let input_file =
                crate::model::files::open_regular(input).map_err(SealError::io(input))?;
            Ok(SealJob {
                cipher: FileCipher::new(key, &salt, header_digest, &file.name),
                input: input.clone(),
                input_file,
                output_path: out_path,
                output,
                size: file.size,
            })
        })
        .collect::<Result<Vec<_>, SealError>>()?;
    let chunk_size = manifest.chunk_size;
    let work: Vec<(usize, u64)> = outputs
        .iter()
        .enumerate()
        .flat_map(|(f, job)| (0..chunk_count(job.size, chunk_size)).map(move |c| (f, c)))
        .collect();
    work.into_par_iter().try_for_each(|(f, index)| {
        let job = &outputs[f];
        let start = index * chunk_size;
        let len = (job.size - start).min(chunk_size) as usize;
        let last = index + 1 == chunk_count(job.size, chunk_size);
        let mut buf = Zeroizing::new(vec![0u8; len + TAG_LEN]);
        job.input_file
            .read_exact_at(&mut buf[..len], start)
            .map_err(SealError::io(&job.input))?;
        let tag = job.cipher.seal(index, last, &mut buf[..len]);
        buf[len..].copy_from_slice(&tag);
        job.output
            .write_all_at(&buf, index * (chunk_size + TAG_LEN as u64))
            .map_err(SealError::io(&job.output_path))?;
        bar.inc(len as u64);
        Ok::<(), SealError>(())
    })?;
    for job in &outputs {
        // A file that changed length between the passes would not match its manifest entry.
        let now = std::fs::metadata(&job.input)
            .map_err(SealError::io(&job.input))?
            .len();
        if now != job.size {
            return Err(SealError::Manifest {
                path: job.input.clone(),
                reason: "the file changed while it was being sealed".into(),
            });
        }
        job.output
            .sync_all()
            .map_err(SealError::io(&job.output_path))?;
    }

    let tmp = out.join(format!(".{MANIFEST_FILE}.tmp"));
    super::write_new_file(&tmp, &manifest_bytes, SEALED_FILE_MODE).map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => SealError::Exists { path: tmp.clone() },
        _ => SealError::Io {
            path: tmp.clone(),
            source: e,
        },
    })?;
    std::fs::rename(&tmp, &manifest_path).map_err(SealError::io(&manifest_path))?;
    File::open(out)
        .and_then(|d| d.sync_all())
        .map_err(SealError::io(out))?;
    bar.finish_with_message("sealed");
    Ok(manifest)
}

/// One file being sealed.
struct SealJob {
    cipher: FileCipher,
    input: PathBuf,
    input_file: File,
    output_path: PathBuf,
    output: File,
    size: u64,
}

/// A byte-count progress bar on stderr, or a hidden one.
fn progress_bar(show: bool, total: u64) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg:>8} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar
}
