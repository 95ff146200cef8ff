//! `inferno seal`: encrypt a model directory for serving as a sealed model.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;

use crate::seal::manifest::{DEFAULT_CHUNK_SIZE, ReleaseRequirements};
use crate::seal::recipient::RecipientKey;
use crate::seal::{ModelKey, SealOptions, seal_dir};
use crate::seal::{snp, tpm};

/// Arguments of `inferno seal`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("key").required(true).args(["key_file", "recipient", "tpm_seal", "snp_seal"])))]
pub struct SealArgs {
    /// The plaintext Hugging Face model directory.
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    /// The sealed model directory to write (created if absent; nothing is overwritten).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// A 32-byte model key file; created (mode 0600) with a fresh random key when absent.
    /// Development only: the production policy refuses key files at serve time.
    #[arg(long, value_name = "FILE")]
    key_file: Option<PathBuf>,
    /// A key broker's public key file (hex X25519, from `inferno keybroker`): a fresh model key
    /// is wrapped to it in the manifest and never written anywhere else.
    #[arg(long, value_name = "FILE")]
    recipient: Option<PathBuf>,
    /// Seal a fresh model key to this machine's (v)TPM under a PCR policy and write the
    /// sealed-key blob (mode 0600) to FILE: serve with `[model.key] source = "tpm"`. The key
    /// unseals only on this TPM, with the selected PCRs at their current values.
    #[arg(long, value_name = "FILE")]
    tpm_seal: Option<PathBuf>,
    /// The TPM of `--tpm-seal` (a TCTI string).
    #[arg(long, value_name = "TCTI", default_value = crate::seal::tpm::DEFAULT_TCTI, requires = "tpm_seal")]
    tpm_tcti: String,
    /// The SHA-256 PCRs of `--tpm-seal`'s policy, e.g. `0-7` or `0,2,4,7`.
    #[arg(
        long,
        value_name = "LIST",
        default_value = "0-7",
        requires = "tpm_seal"
    )]
    tpm_pcrs: String,
    /// Wrap a fresh model key under this SEV-SNP guest's derived key (MSG_KEY_REQ: VCEK root,
    /// launch measurement and guest policy mixed in) and write the blob (mode 0600) to FILE:
    /// serve with `[model.key] source = "snp"`. Needs /dev/sev-guest; never run on hardware.
    #[arg(long, value_name = "FILE")]
    snp_seal: Option<PathBuf>,
    /// With `--snp-seal`: the VMPL of the request (at least the guest's own).
    #[arg(long, value_name = "N", default_value_t = 0, requires = "snp_seal")]
    snp_vmpl: u32,
    /// With `--snp-seal`: also mix in this TCB version (u64), so firmware older than it cannot
    /// derive the key.
    #[arg(long, value_name = "TCB", requires = "snp_seal")]
    snp_tcb: Option<u64>,
    /// Plaintext bytes per chunk.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_CHUNK_SIZE)]
    chunk_size: u64,
    /// The model id a key broker files the key under (default: the model directory's name).
    #[arg(long, value_name = "ID")]
    model_id: Option<String>,
    /// A server policy digest (hex SHA-256) under which the model may be opened; repeat for
    /// several. Without any, any policy may open it.
    #[arg(long = "require-policy", value_name = "SHA256")]
    require_policy: Vec<String>,
}

/// Runs `inferno seal`.
pub fn run(args: SealArgs) -> ExitCode {
    match seal(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => super::fail(&err),
    }
}

fn seal(args: SealArgs) -> anyhow::Result<()> {
    let start = Instant::now();
    let mut tpm_blob = None;
    let mut snp_blob = None;
    let key_args = (
        &args.key_file,
        &args.recipient,
        &args.tpm_seal,
        &args.snp_seal,
    );
    let (key, recipient, key_note) = match key_args {
        (Some(path), None, None, None) => {
            let (key, created) = ModelKey::read_or_create(path)?;
            let note = if created {
                format!("new key written to {} (mode 0600)", path.display())
            } else {
                format!("key read from {}", path.display())
            };
            (key, None, note)
        }
        (None, Some(path), None, None) => {
            let recipient = RecipientKey::read_file(path)?;
            let note = format!("fresh key wrapped to key broker {}", recipient.to_hex());
            (ModelKey::generate()?, Some(recipient), note)
        }
        (None, None, Some(path), None) => {
            if path.exists() {
                anyhow::bail!("{}: already exists (refusing to overwrite)", path.display());
            }
            let pcrs =
                tpm::parse_pcrs(&args.tpm_pcrs).map_err(|e| anyhow::anyhow!("--tpm-pcrs: {e}"))?;
            let key = ModelKey::generate()?;
            tpm_blob = Some((path.clone(), tpm::seal_key(&args.tpm_tcti, &key, &pcrs)?));
            let note = format!(
                "fresh key sealed to TPM {} under SHA-256 PCRs {pcrs:?}, blob {} (mode 0600)",
                args.tpm_tcti,
                path.display()
            );
            (key, None, note)
        }
        (None, None, None, Some(path)) => {
            if path.exists() {
                anyhow::bail!("{}: already exists (refusing to overwrite)", path.display());
            }
            let params = snp::SnpKeyParams {
                vmpl: args.snp_vmpl,
                tcb_version: args.snp_tcb,
                ..snp::SnpKeyParams::default()
            };
            // Derive first: without SNP hardware nothing is written.
            let kek = snp::derive(&params)?;
            let key = ModelKey::generate()?;
            snp_blob = Some((path.clone(), snp::wrap(&key, &params, &kek)));
            let note = format!(
                "fresh key wrapped under the SEV-SNP derived key, blob {} (mode 0600)",
                path.display()
            );
            (key, None, note)
        }
        _ => {
            anyhow::bail!("give exactly one of --key-file, --recipient, --tpm-seal and --snp-seal")
        }
    };
    let model_id = args
        .model_id
        .clone()
        .unwrap_or_else(|| crate::model::Model::name_of_dir(&args.model));
    let options = SealOptions {
        chunk_size: args.chunk_size,
        release: ReleaseRequirements {
            model_id: Some(model_id),
            policy_sha256: args
                .require_policy
                .iter()
                .map(|d| d.to_ascii_lowercase())
                .collect(),
        },
        recipient,
        progress: std::io::stderr().is_terminal(),
    };
    let manifest = seal_dir(&args.model, &args.out, &key, &options)
        .with_context(|| format!("cannot seal {}", args.model.display()))?;
    if let Some((path, blob)) = tpm_blob {
        blob.write(&path)?;
    }
    if let Some((path, blob)) = snp_blob {
        blob.write(&path)?;
    }
    let bytes: u64 = manifest.files.iter().map(|f| f.size).sum();
    let secs = start.elapsed().as_secs_f64();
    println!(
        "sealed {} files ({bytes} bytes) into {} in {secs:.2} s\n  model digest: {}\n  key id:       {}\n  key:          {key_note}",
        manifest.files.len(),
        args.out.display(),
        manifest.model_digest,
        manifest.key_id,
    );
    Ok(())
}
