//! A sealed model at start-up: the digest its manifest states (which the start-up evidence binds),
//! its key from the configured source (a key file, the TPM, an SEV-SNP derived key or a key
//! broker), and its chunks decrypted and hashed, every release or refusal in the audit log.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use indicatif::ProgressBar;

use crate::attest::StartupAttestation;
use crate::backend::cuda::EarlyUpload;
use crate::config::{AttestationConfig, ModelKeySource};
use crate::model::{Model, ModelFiles};
use crate::seal::{self, ModelKey};
use crate::server::Server;

/// When `dir` holds a sealed model: obtains its key from `source` (refusing a key file outside
/// the development profile; asking a key broker with fresh evidence collected under
/// `attestation`), decrypts it and records the release, or the refusal, in the audit log before
/// returning; each chunk decrypted goes to `early` as well when given. `None` for a plaintext
/// model (then `source` must be absent).
pub(super) async fn open_sealed_model(
    server: &Server,
    startup: &StartupAttestation,
    dir: Option<&Path>,
    source: Option<ModelKeySource>,
    attestation: &AttestationConfig,
    progress: &ProgressBar,
    early: Option<Arc<EarlyUpload>>,
) -> anyhow::Result<Option<ModelFiles>> {
    let sealed_dir = dir.filter(|d| seal::is_sealed(d)).map(Path::to_path_buf);
    let (dir, source) = match (sealed_dir, source) {
        (None, None) => return Ok(None),
        (None, Some(_)) => anyhow::bail!(
            "a model key source is configured but {} is not a sealed model (no {})",
            dir.map_or_else(|| "the embedded model".into(), |d| d.display().to_string()),
            seal::MANIFEST_FILE
        ),
        (Some(dir), source) => (dir, source),
    };
    let key_id = seal::Manifest::read(&dir)
        .map(|(manifest, _)| manifest.key_id)
        .unwrap_or_else(|_| "unknown".into());
    let refuse = async |reason: String| -> anyhow::Error {
        let record = server
            .record_key_release(key_id.clone(), false, reason.clone())
            .await;
        match record {
            Ok(()) => anyhow::anyhow!("sealed model refused: {reason}"),
            Err(err) => anyhow::anyhow!(
                "sealed model refused: {reason} (and the audit record failed: {err})"
            ),
        }
    };
    let (key, how) = match source {
        None => {
            return Err(refuse(format!(
                "{} is a sealed model and no key source is configured ([model.key] or --model-key-file)",
                dir.display()
            ))
            .await);
        }
        Some(ModelKeySource::File { path }) => {
            if let Err(reason) = seal::check_key_file_allowed(startup.profile) {
                return Err(refuse(format!("key file {}: {reason}", path.display())).await);
            }
            match ModelKey::read_file(&path) {
                Ok(key) => (
                    key,
                    format!("key file {} (development profile)", path.display()),
                ),
                Err(err) => return Err(refuse(err.to_string()).await),
            }
        }
        Some(ModelKeySource::Tpm { blob, tcti }) => {
            let tcti = tcti.unwrap_or_else(|| seal::tpm::DEFAULT_TCTI.to_owned());
            let unsealed = tokio::task::spawn_blocking({
                let (blob, tcti) = (blob.clone(), tcti.clone());
                move || {
                    seal::tpm::TpmSealedKey::read(&blob)
                        .and_then(|sealed| seal::tpm::unseal_key(&tcti, &sealed))
                }
            })
            .await
            .context("unsealing from the TPM panicked")?;
            match unsealed {
                Ok(key) => (key, format!("TPM {tcti}, blob {}", blob.display())),
                Err(err) => return Err(refuse(err.to_string()).await),
            }
        }
        Some(ModelKeySource::Snp { blob }) => {
            let unsealed = tokio::task::spawn_blocking({
                let blob = blob.clone();
                move || {
                    seal::snp::SnpSealedKey::read(&blob)
                        .and_then(|sealed| seal::snp::unseal(&sealed))
                }
            })
            .await
            .context("the SEV-SNP derived key task panicked")?;
            match unsealed {
                Ok(key) => (key, format!("SEV-SNP derived key, blob {}", blob.display())),
                Err(err) => return Err(refuse(err.to_string()).await),
            }
        }
        Some(ModelKeySource::Broker { url, retries }) => {
            match key_from_broker(startup, &dir, &url, retries, attestation).await {
                Ok(key) => (key, format!("key broker {url}")),
                Err(reason) => return Err(refuse(reason).await),
            }
        }
    };
    let policy = startup.policy_sha256().to_owned();
    let opened = tokio::task::spawn_blocking({
        let dir = dir.clone();
        let progress = progress.clone();
        move || {
            let started = std::time::Instant::now();
            progress.set_message("decrypting");
            let (manifest, files) = match &early {
                Some(early) => seal::open_sealed_streaming(&dir, &key, &progress, &**early)?,
                None => seal::open_sealed_reporting(&dir, &key, &progress)?,
            };
            drop(key);
            let bytes: u64 = manifest.files.iter().map(|f| f.size).sum();
            let secs = started.elapsed().as_secs_f64();
            tracing::info!(
                bytes,
                ms = (secs * 1e3) as u64,
                gb_per_s = format!("{:.1}", bytes as f64 / secs.max(1e-9) / 1e9),
                "sealed model opened (read, decrypted and hashed in one pass)"
            );
            let allowed = &manifest.release.policy_sha256;
            if !allowed.is_empty() && !allowed.contains(&policy) {
                return Err(anyhow::anyhow!(
                    "the server policy {policy} is not among the policies the model was sealed for"
                ));
            }
            Ok::<_, anyhow::Error>(files)
        }
    })
    .await
    .context("opening the sealed model panicked")?;
    match opened {
        Ok(files) => {
            server
                .record_key_release(key_id, true, how)
                .await
                .context("audit: the key release record failed")?;
            Ok(Some(files))
        }
        Err(err) => Err(refuse(format!("{err:#}")).await),
    }
}

/// Asks the key broker at `url` for the key of the sealed model in `dir`, with fresh evidence
/// binding the broker's challenge and an ephemeral key; the one-line reason when none came.
async fn key_from_broker(
    startup: &StartupAttestation,
    dir: &Path,
    url: &str,
    retries: u32,
    attestation: &AttestationConfig,
) -> Result<ModelKey, String> {
    let (manifest, _) = seal::Manifest::read(dir).map_err(|e| e.to_string())?;
    let wrapped_key = manifest.wrapped_key.clone().ok_or_else(|| {
        format!(
            "{} was not sealed for a key broker (no wrapped_key; seal it with `inferno seal --recipient`)",
            dir.display()
        )
    })?;
    let tee = serde_json::to_value(startup.evidence.platform)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let request = crate::keybroker::KeyRequest {
        model_id: manifest
            .release
            .model_id
            .clone()
            .unwrap_or_else(|| Model::name_of_dir(dir)),
        key_id: manifest.key_id.clone(),
        wrapped_key,
        tee,
    };
    let config = attestation.clone();
    let evidence_for = move |mut runtime_data| {
        crate::attest::collect_fresh_evidence(&config, &mut runtime_data).map_err(|e| e.to_string())
    };
    crate::keybroker::request_key(url, &request, &startup.runtime_data, retries, evidence_for)
        .await
        .map_err(|e| e.to_string())
}

/// The model digest a sealed model's manifest states, read before the model is opened (the
/// start-up evidence binds it); `None` for a plaintext model or the embedded default.
pub(super) fn sealed_model_digest(dir: Option<&Path>) -> anyhow::Result<Option<[u8; 32]>> {
    let Some(dir) = dir.filter(|d| seal::is_sealed(d)) else {
        return Ok(None);
    };
    let (manifest, _) = seal::Manifest::read(dir).with_context(|| {
        format!(
            "cannot read the sealed model's manifest in {}",
            dir.display()
        )
    })?;
    let bytes = hex::decode(&manifest.model_digest)
        .ok()
        .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
        .with_context(|| {
            format!(
                "the sealed model's manifest in {} has no valid model_digest",
                dir.display()
            )
        })?;
    Ok(Some(bytes))
}
