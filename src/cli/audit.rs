//! `inferno audit`: verify, inspect, export, prune, prove and witness audit logs.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use time::OffsetDateTime;

use inferno_attestation::bundle::CollateralBundle;
use inferno_attestation::policy::LoadedPolicy;

use inferno_audit::merkle::{TreeView, verify_consistency, verify_inclusion};
use inferno_audit::note::{ALG_COSIGNATURE_V1, Checkpoint, NoteSigner, SignedNote, VerifierKey};
use inferno_audit::{
    ConsistencyProof, InclusionProof, Record, VerifyOptions, add_checkpoint, load_tree, prune,
    stored_checkpoints, verify,
};

use crate::attest::binding::{BindingInput, check_start_events};

mod pack;
mod records;
mod report;
mod summary;
mod witness_http;

/// Arguments of `inferno audit`.
#[derive(Debug, clap::Args)]
pub struct AuditArgs {
    #[command(subcommand)]
    command: AuditCommand,
}

#[derive(Debug, clap::Subcommand)]
enum AuditCommand {
    /// Check every frame, hash, checkpoint signature and root; exit 0 intact, 1 violation.
    Verify(VerifyArgs),
    /// Print records (JSON lines), filtered.
    Show(records::ShowArgs),
    /// Export all records as JSON lines or CSV.
    Export(records::ExportArgs),
    /// Export, then remove old segments (a signed checkpoint keeps the rest verifiable).
    Prune(PruneArgs),
    /// Print the latest signed checkpoint.
    Checkpoint(DirArg),
    /// Print an inclusion proof for one record.
    Prove(ProveArgs),
    /// Print a consistency proof between two tree sizes.
    Consistency(ConsistencyArgs),
    /// Verify the log and write a self-contained HTML report for a compliance officer.
    Report(report::ReportArgs),
    /// Verify the log and pack it with its transcript, report, policies and a README for an
    /// external auditor (a tar file).
    EvidencePack(pack::PackArgs),
    /// Check a receipt (the body of `GET /v1/audit/proof`) offline against the audit key.
    Receipt(ReceiptArgs),
    /// Countersign checkpoints as a witness.
    Witness(WitnessArgs),
}

#[derive(Debug, clap::Args)]
struct ReceiptArgs {
    /// The receipt file: the JSON body `GET /v1/audit/proof?index=N` answered, or the output of
    /// `inferno audit prove`.
    receipt: PathBuf,
    /// The audit key (note verifier key) the start-up evidence binds (`/v1/attestation`'s
    /// runtime data, `audit_key`).
    #[arg(long)]
    key: String,
    /// The leaf hash the response's `inferno-audit-leaf` header carried (hex).
    #[arg(long)]
    leaf: Option<String>,
    /// The record itself, as one line of `inferno audit export --format jsonl` (the stored
    /// bytes its leaf hash covers), checked against a `prove` output's leaf.
    #[arg(long)]
    record: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct DirArg {
    /// The log directory.
    dir: PathBuf,
}

#[derive(Debug, clap::Args)]
struct VerifyArgs {
    /// The log directory.
    dir: PathBuf,
    #[command(flatten)]
    inputs: VerifyInputs,
    /// Print the verdict and summary as one JSON object.
    #[arg(long)]
    json: bool,
}

/// What verification takes besides the log directory (shared by `verify`, `report` and
/// `evidence-pack`).
#[derive(Debug, Clone, clap::Args)]
struct VerifyInputs {
    /// A checkpoint (e.g. witness-cosigned) that the log must contain.
    #[arg(long)]
    trusted_checkpoint: Option<PathBuf>,
    /// A witness verifier key whose cosignature the trusted checkpoint must carry (repeatable).
    #[arg(long, requires = "trusted_checkpoint")]
    witness_key: Vec<String>,
    /// An attestation policy every checkpoint key's evidence must satisfy.
    #[arg(long, requires = "collateral")]
    policy: Option<PathBuf>,
    /// The collateral bundle for appraising the evidence of start events.
    #[arg(long, requires = "policy")]
    collateral: Option<PathBuf>,
    /// Waive freshness when appraising the start events' evidence (an old log, or quotes taken
    /// without a nonce): the verdict says NOT FRESH and fails unless the policy sets
    /// `[time] allow_unfresh_evidence = true`.
    #[arg(long, requires = "policy")]
    no_freshness: bool,
    /// Report a gap where records waited this many seconds or more for a checkpoint.
    #[arg(long, default_value_t = summary::DEFAULT_GAP_SECONDS)]
    gap_seconds: u64,
}

impl VerifyInputs {
    /// The command-line flags that give these inputs again.
    fn flags(&self) -> Vec<String> {
        let mut flags = Vec::new();
        let mut push = |flag: &str, value: String| {
            flags.push(flag.to_owned());
            flags.push(value);
        };
        if let Some(p) = &self.trusted_checkpoint {
            push("--trusted-checkpoint", p.display().to_string());
        }
        for k in &self.witness_key {
            push("--witness-key", k.clone());
        }
        if let Some(p) = &self.policy {
            push("--policy", p.display().to_string());
        }
        if let Some(p) = &self.collateral {
            push("--collateral", p.display().to_string());
        }
        if self.gap_seconds != summary::DEFAULT_GAP_SECONDS {
            push("--gap-seconds", self.gap_seconds.to_string());
        }
        if self.no_freshness {
            flags.push("--no-freshness".to_owned());
        }
        flags
    }
}

/// A verified (or not) log: its summary and records.
struct Checked {
    summary: summary::Summary,
    records: Vec<Record>,
    failed: bool,
}

#[derive(Debug, clap::Args)]
struct PruneArgs {
    /// The log directory (the server must not be writing to it).
    dir: PathBuf,
    /// How many of the newest segments to keep.
    #[arg(long)]
    keep_segments: usize,
    /// Where to export the removed records first (JSON lines).
    #[arg(long)]
    export: PathBuf,
}

#[derive(Debug, clap::Args)]
struct ProveArgs {
    /// The log directory.
    dir: PathBuf,
    /// The record index.
    #[arg(long)]
    index: u64,
}

#[derive(Debug, clap::Args)]
struct ConsistencyArgs {
    /// The log directory.
    dir: PathBuf,
    /// The older tree size.
    old: u64,
    /// The newer tree size.
    new: u64,
}

#[derive(Debug, clap::Args)]
struct WitnessArgs {
    #[command(subcommand)]
    command: WitnessCommand,
}

#[derive(Debug, clap::Subcommand)]
enum WitnessCommand {
    /// Cosign a checkpoint if it extends the last one this witness cosigned.
    Cosign(CosignArgs),
    /// Print this witness's verifier key (for the appliance's `witness_keys`).
    Vkey(WitnessKeyArgs),
    /// Serve `POST /add-checkpoint` over HTTP (c2sp.org/tlog-witness semantics).
    Serve(WitnessServeArgs),
}

#[derive(Debug, clap::Args)]
struct WitnessServeArgs {
    #[command(flatten)]
    witness: WitnessKeyArgs,
    /// The witness state file; initialise it with `witness cosign --init` first.
    #[arg(long)]
    state: PathBuf,
    /// A file of accepted log verifier keys, one per line, re-read for every request.
    #[arg(long)]
    log_keys: PathBuf,
    /// Address to listen on (plain HTTP; put TLS in front of it when off loopback).
    #[arg(long, default_value = "127.0.0.1:7380")]
    listen: std::net::SocketAddr,
}

#[derive(Debug, clap::Args)]
struct WitnessKeyArgs {
    /// The witness's Ed25519 private key (PKCS#8 DER, e.g. from `openssl genpkey -algorithm
    /// ed25519 -outform DER`).
    #[arg(long)]
    key: PathBuf,
    /// The witness's key name (e.g. `witness.example.com/compliance`).
    #[arg(long)]
    name: String,
}

#[derive(Debug, clap::Args)]
struct CosignArgs {
    #[command(flatten)]
    witness: WitnessKeyArgs,
    /// The witness state file (the last cosigned checkpoint).
    #[arg(long)]
    state: PathBuf,
    /// The log's checkpoint verifier key (from the start event of the run that signed it).
    #[arg(long)]
    log_key: String,
    /// The checkpoint to cosign.
    #[arg(long)]
    checkpoint: PathBuf,
    /// A consistency proof from the witness's last size (from `inferno audit consistency`).
    #[arg(long)]
    proof: Option<PathBuf>,
    /// Trust this checkpoint although the witness has no state yet.
    #[arg(long)]
    init: bool,
    /// Where to write the cosigned checkpoint.
    #[arg(long)]
    out: PathBuf,
}

/// Runs `inferno audit`.
pub fn run(args: AuditArgs) -> ExitCode {
    match args.command {
        AuditCommand::Verify(a) => run_verify(&a),
        AuditCommand::Report(a) => verdict_exit(report::run(&a)),
        AuditCommand::EvidencePack(a) => verdict_exit(pack::run(&a)),
        other => match run_other(other) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => super::fail(&e),
        },
    }
}

/// Exit 0 for an intact log, 1 for a violation, 2 for a usage error (as `verify`).
fn verdict_exit(outcome: anyhow::Result<bool>) -> ExitCode {
    match outcome {
        Ok(false) => ExitCode::SUCCESS,
        Ok(true) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run_other(command: AuditCommand) -> anyhow::Result<()> {
    match command {
        AuditCommand::Verify(_) | AuditCommand::Report(_) | AuditCommand::EvidencePack(_) => Ok(()),
        AuditCommand::Show(a) => records::show(&a),
        AuditCommand::Export(a) => records::export(&a),
        AuditCommand::Prune(a) => {
            require_dir(&a.dir)?;
            let outcome = prune(&a.dir, a.keep_segments, &a.export)?;
            println!(
                "pruned {} segments ({} records, exported to {}); the log now starts at record {}",
                outcome.segments_removed,
                outcome.records_removed,
                a.export.display(),
                outcome.first_index
            );
            Ok(())
        }
        AuditCommand::Checkpoint(a) => {
            require_dir(&a.dir)?;
            let checkpoints = stored_checkpoints(&a.dir)?;
            let last = checkpoints.last().context("the log has no checkpoint")?;
            print!("{last}");
            Ok(())
        }
        AuditCommand::Prove(a) => prove(&a),
        AuditCommand::Consistency(a) => consistency(&a),
        AuditCommand::Receipt(a) => receipt(&a),
        AuditCommand::Witness(a) => match a.command {
            WitnessCommand::Vkey(k) => {
                println!("{}", load_witness(&k)?.verifier().render());
                Ok(())
            }
            WitnessCommand::Cosign(c) => cosign(&c),
            WitnessCommand::Serve(s) => serve_witness(s),
        },
    }
}

/// `inferno audit receipt`: exit 0 when the receipt verifies, else one line naming the defect.
fn receipt(a: &ReceiptArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&a.receipt)
        .with_context(|| format!("cannot read {}", a.receipt.display()))?;
    if text.starts_with("inferno-audit-inclusion/") {
        return check_prove_output(a, &text)
            .with_context(|| format!("proof {} rejected", a.receipt.display()));
    }
    if a.record.is_some() {
        bail!(
            "--record checks the output of `inferno audit prove`; a server receipt carries its record"
        );
    }
    let receipt: crate::server::receipt::ProofResponse = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a receipt", a.receipt.display()))?;
    let verified = crate::server::receipt::verify(&receipt, &a.key, a.leaf.as_deref())
        .with_context(|| format!("receipt {} rejected", a.receipt.display()))?;
    println!(
        "receipt verified: record {} is in the log's signed checkpoint of {} records{}",
        verified.index,
        verified.checkpoint_size,
        if verified.record_checked {
            "; the record matches its leaf hash"
        } else {
            " (no record in the receipt: only its leaf hash is proven)"
        }
    );
    Ok(())
}

/// Checks the output of `inferno audit prove` offline: the checkpoint's signature by `--key`,
/// then the leaf's inclusion at the checkpoint's size and root (and the record's bytes, or
/// `--leaf`, against the proven leaf).
fn check_prove_output(a: &ReceiptArgs, text: &str) -> anyhow::Result<()> {
    let (proof_text, note_text) = text
        .split_once("\n\n")
        .context("no signed checkpoint after the inclusion proof")?;
    let proof = InclusionProof::parse(&format!("{proof_text}\n"))?;
    let note = SignedNote::parse(note_text)?;
    let key = VerifierKey::parse(&a.key).context("--key")?;
    key.verify(&note)
        .with_context(|| format!("the checkpoint is not signed by {}", key.name))?;
    let cp = note.checkpoint()?;
    if cp.size != proof.size {
        bail!(
            "the proof is for tree size {} but the checkpoint signs size {}",
            proof.size,
            cp.size
        );
    }
    verify_inclusion(
        proof.index,
        proof.size,
        &proof.leaf,
        &proof.hashes,
        &cp.root,
    )
    .context("the inclusion proof does not lead to the checkpoint's root")?;
    if let Some(leaf) = &a.leaf
        && !leaf.eq_ignore_ascii_case(&hex::encode(proof.leaf))
    {
        bail!(
            "--leaf {leaf} is not the proven leaf {}",
            hex::encode(proof.leaf)
        );
    }
    let mut record_checked = false;
    if let Some(path) = &a.record {
        let bytes =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        let line = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
        if inferno_audit::merkle::leaf_hash(line) != proof.leaf {
            bail!(
                "the record in {} does not hash to the proven leaf",
                path.display()
            );
        }
        let record = Record::decode(line).context("--record is not an audit record")?;
        if record.index != proof.index {
            bail!(
                "the record says index {}, the proof is for {}",
                record.index,
                proof.index
            );
        }
        record_checked = true;
    }
    println!(
        "proof verified: record {} is in the log {:?} at its checkpoint of {} records signed by {}{}",
        proof.index,
        cp.origin,
        cp.size,
        key.name,
        if record_checked {
            "; the record matches its leaf hash"
        } else {
            " (no record given: only its leaf hash is proven)"
        }
    );
    Ok(())
}

fn require_dir(dir: &Path) -> anyhow::Result<()> {
    if !dir.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    Ok(())
}

fn run_verify(a: &VerifyArgs) -> ExitCode {
    let checked = match verify_with(&a.dir, &a.inputs) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    let summary = &checked.summary;
    if a.json {
        match serde_json::to_string_pretty(summary) {
            Ok(j) => println!("{j}"),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        if let Some(line) = &summary.attested {
            println!("{line}");
        }
        println!("{}", summary.verdict_line);
        if !checked.failed {
            for id in &summary.incomplete_requests {
                println!("incomplete: request {id} has no completion record");
            }
            print!("{}", summary.render_text());
        }
    }
    if checked.failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Verifies the log in `dir` (and the key bindings, when a policy and collateral are given)
/// and summarises it. An error is a usage error (bad argument, unreadable input file).
fn verify_with(dir: &Path, inputs: &VerifyInputs) -> anyhow::Result<Checked> {
    if !dir.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    let binding = load_binding_inputs(inputs)?;
    let mut options = VerifyOptions::default();
    if let Some(path) = &inputs.trusted_checkpoint {
        options.trusted_checkpoint =
            Some(std::fs::read_to_string(path).with_context(|| path.display().to_string())?);
    }
    for k in &inputs.witness_key {
        options
            .witness_keys
            .push(VerifierKey::parse(k).with_context(|| format!("--witness-key {k:?}"))?);
    }
    let mut report = verify(dir, &options);
    let mut attested = None;
    if let (true, Some((policy, collateral))) = (report.intact(), &binding) {
        let input = BindingInput {
            policy,
            collateral: Some(collateral),
            now: OffsetDateTime::now_utc(),
            no_freshness: inputs.no_freshness,
        };
        match check_start_events(&report.starts, &input) {
            Ok(n) => {
                attested = Some(format!(
                    "ATTESTED{}: {n} checkpoint keys bound to evidence that passes policy {:?}",
                    if inputs.no_freshness {
                        ", NOT FRESH"
                    } else {
                        ""
                    },
                    policy.policy.name
                ));
            }
            Err(reason) => {
                report.violation = Some(inferno_audit::Violation {
                    location: None,
                    index: None,
                    reason,
                });
            }
        }
    }
    let records: Vec<Record> = if report.intact() {
        inferno_audit::read_records(dir)
            .map(|rs| rs.into_iter().map(|r| r.record).collect())
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    let summary = summary::summarize(
        dir,
        &summary::SummaryInput {
            report: &report,
            records: &records,
            trusted_checkpoint: options.trusted_checkpoint.as_deref(),
            witness_keys: &options.witness_keys,
            attested,
            gap_seconds: inputs.gap_seconds,
        },
    );
    Ok(Checked {
        summary,
        records,
        failed: !report.intact(),
    })
}

/// Loads `--policy` and `--collateral` (clap requires both or neither).
fn load_binding_inputs(
    a: &VerifyInputs,
) -> anyhow::Result<Option<(LoadedPolicy, CollateralBundle)>> {
    let (Some(policy), Some(collateral)) = (&a.policy, &a.collateral) else {
        return Ok(None);
    };
    let policy = LoadedPolicy::from_file(policy)
        .with_context(|| format!("--policy {}", policy.display()))?;
    let collateral = CollateralBundle::from_file(collateral)
        .with_context(|| format!("--collateral {}", collateral.display()))?;
    Ok(Some((policy, collateral)))
}

fn latest_checkpoint(dir: &Path) -> anyhow::Result<(SignedNote, Checkpoint)> {
    let checkpoints = stored_checkpoints(dir)?;
    let last = checkpoints.last().context("the log has no checkpoint")?;
    let note = SignedNote::parse(last)?;
    let cp = note.checkpoint()?;
    Ok((note, cp))
}

fn prove(a: &ProveArgs) -> anyhow::Result<()> {
    require_dir(&a.dir)?;
    let (note, cp) = latest_checkpoint(&a.dir)?;
    let (prefix, leaves) = load_tree(&a.dir)?;
    let view = TreeView::new(&prefix, &leaves);
    if a.index >= cp.size {
        bail!(
            "record {} is not covered by the latest checkpoint (size {})",
            a.index,
            cp.size
        );
    }
    let hashes = view.inclusion_proof(a.index, cp.size)?;
    let offset = a
        .index
        .checked_sub(prefix.size())
        .context("the record was pruned")?;
    let leaf = *leaves
        .get(usize::try_from(offset)?)
        .context("record index out of range")?;
    verify_inclusion(a.index, cp.size, &leaf, &hashes, &cp.root)?;
    let proof = InclusionProof {
        index: a.index,
        size: cp.size,
        leaf,
        hashes,
    };
    print!("{}\n{}", proof.render(), note.render());
    Ok(())
}

fn consistency(a: &ConsistencyArgs) -> anyhow::Result<()> {
    require_dir(&a.dir)?;
    let (prefix, leaves) = load_tree(&a.dir)?;
    let view = TreeView::new(&prefix, &leaves);
    let hashes = view.consistency_proof(a.old, a.new)?;
    let (old_root, new_root) = (view.root_at(a.old)?, view.root_at(a.new)?);
    verify_consistency(a.old, a.new, &old_root, &new_root, &hashes)?;
    print!(
        "{}",
        ConsistencyProof {
            old: a.old,
            new: a.new,
            hashes
        }
        .render()
    );
    Ok(())
}

fn load_witness(k: &WitnessKeyArgs) -> anyhow::Result<NoteSigner> {
    let der = zeroize::Zeroizing::new(
        std::fs::read(&k.key).with_context(|| format!("reading {}", k.key.display()))?,
    );
    NoteSigner::from_pkcs8(&k.name, ALG_COSIGNATURE_V1, &der)
        .with_context(|| format!("witness key {}", k.key.display()))
}

fn cosign(c: &CosignArgs) -> anyhow::Result<()> {
    let signer = load_witness(&c.witness)?;
    let log_key = VerifierKey::parse(&c.log_key).context("--log-key")?;
    let text = std::fs::read_to_string(&c.checkpoint)
        .with_context(|| format!("reading {}", c.checkpoint.display()))?;
    let note = SignedNote::parse(&text).with_context(|| c.checkpoint.display().to_string())?;
    let proof = match &c.proof {
        Some(p) => Some(ConsistencyProof::parse(
            &std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
        )?),
        None => None,
    };
    let now = u64::try_from(OffsetDateTime::now_utc().unix_timestamp())?;
    let cosigned = add_checkpoint(
        &c.state,
        &signer,
        &note,
        &log_key,
        proof.as_ref(),
        c.init,
        now,
    )?;
    std::fs::write(&c.out, cosigned.render())
        .with_context(|| format!("writing {}", c.out.display()))?;
    let cp = cosigned.checkpoint()?;
    println!("cosigned {} at size {}", cp.origin, cp.size);
    Ok(())
}

fn serve_witness(args: WitnessServeArgs) -> anyhow::Result<()> {
    let signer = load_witness(&args.witness)?;
    let witness = witness_http::HttpWitness {
        signer,
        state: args.state,
        log_keys: args.log_keys,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        println!("witness listening on http://{}", listener.local_addr()?);
        std::io::stdout().flush()?;
        witness_http::serve(listener, witness).await?;
        Ok(())
    })
}
