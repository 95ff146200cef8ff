//! `inferno audit`: verify, inspect, export, prune, prove and witness audit logs.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use inferno_attestation::bundle::CollateralBundle;
use inferno_attestation::policy::LoadedPolicy;

use inferno_audit::merkle::{TreeView, verify_consistency, verify_inclusion};
use inferno_audit::note::{ALG_COSIGNATURE_V1, Checkpoint, NoteSigner, SignedNote, VerifierKey};
use inferno_audit::{
    ConsistencyProof, ContentMode, ContentPolicy, InclusionProof, Record, RecordBody,
    SecurityEvent, VerifyOptions, add_checkpoint, load_tree, prune, read_key_file,
    stored_checkpoints, verify,
};

use crate::attest::binding::{BindingInput, check_start_events};

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
    Show(ShowArgs),
    /// Export all records as JSON lines or CSV.
    Export(ExportArgs),
    /// Export, then remove old segments (a signed checkpoint keeps the rest verifiable).
    Prune(PruneArgs),
    /// Print the latest signed checkpoint.
    Checkpoint(DirArg),
    /// Print an inclusion proof for one record.
    Prove(ProveArgs),
    /// Print a consistency proof between two tree sizes.
    Consistency(ConsistencyArgs),
    /// Check a receipt (the body of `GET /v1/audit/proof`) offline against the audit key.
    Receipt(ReceiptArgs),
    /// Countersign checkpoints as a witness.
    Witness(WitnessArgs),
}

#[derive(Debug, clap::Args)]
struct ReceiptArgs {
    /// The receipt file: the JSON body `GET /v1/audit/proof?index=N` answered.
    receipt: PathBuf,
    /// The audit key (note verifier key) the start-up evidence binds (`/v1/attestation`'s
    /// runtime data, `audit_key`).
    #[arg(long)]
    key: String,
    /// The leaf hash the response's `inferno-audit-leaf` header carried (hex).
    #[arg(long)]
    leaf: Option<String>,
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
}

#[derive(Debug, clap::Args)]
struct ShowArgs {
    /// The log directory.
    dir: PathBuf,
    /// Only records at or after this time (RFC 3339).
    #[arg(long)]
    since: Option<String>,
    /// Only records before this time (RFC 3339).
    #[arg(long)]
    until: Option<String>,
    /// Only request records of this principal (API key id) and their completions.
    #[arg(long)]
    principal: Option<String>,
    /// Only records of this request id.
    #[arg(long)]
    request_id: Option<String>,
    /// Only records of this kind: `request`, `completion` or an event name (e.g. `started`).
    #[arg(long)]
    event_type: Option<String>,
    /// A content key file: decrypt encrypted prompts and completions.
    #[arg(long)]
    decrypt_key: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum ExportFormat {
    Jsonl,
    Csv,
}

#[derive(Debug, clap::Args)]
struct ExportArgs {
    /// The log directory.
    dir: PathBuf,
    /// The output format.
    #[arg(long, value_enum)]
    format: ExportFormat,
    /// Write to this file instead of standard output.
    #[arg(long, short)]
    output: Option<PathBuf>,
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
        other => match run_other(other) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => super::fail(&e),
        },
    }
}

fn run_other(command: AuditCommand) -> anyhow::Result<()> {
    match command {
        AuditCommand::Verify(_) => Ok(()),
        AuditCommand::Show(a) => show(&a),
        AuditCommand::Export(a) => export(&a),
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

fn require_dir(dir: &Path) -> anyhow::Result<()> {
    if !dir.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    Ok(())
}

fn run_verify(a: &VerifyArgs) -> ExitCode {
    let usage = |msg: String| {
        eprintln!("error: {msg}");
        ExitCode::from(2)
    };
    if !a.dir.is_dir() {
        return usage(format!("{} is not a directory", a.dir.display()));
    }
    let binding = match load_binding_inputs(a) {
        Ok(b) => b,
        Err(e) => return usage(format!("{e:#}")),
    };
    let mut options = VerifyOptions::default();
    if let Some(path) = &a.trusted_checkpoint {
        match std::fs::read_to_string(path) {
            Ok(t) => options.trusted_checkpoint = Some(t),
            Err(e) => return usage(format!("{}: {e}", path.display())),
        }
    }
    for k in &a.witness_key {
        match VerifierKey::parse(k) {
            Ok(k) => options.witness_keys.push(k),
            Err(e) => return usage(format!("--witness-key {k:?}: {e}")),
        }
    }
    let report = verify(&a.dir, &options);
    if let (true, Some((policy, collateral))) = (report.intact(), &binding) {
        let input = BindingInput {
            policy,
            collateral: Some(collateral),
            now: OffsetDateTime::now_utc(),
        };
        match check_start_events(&report.starts, &input) {
            Ok(n) => println!(
                "ATTESTED: {n} checkpoint keys bound to evidence that passes policy {:?}",
                policy.policy.name
            ),
            Err(reason) => {
                println!("VIOLATION: {reason}");
                return ExitCode::FAILURE;
            }
        }
    }
    println!("{}", report.verdict());
    if !report.intact() {
        return ExitCode::FAILURE;
    }
    for id in &report.incomplete {
        println!("incomplete: request {id} has no completion record");
    }
    ExitCode::SUCCESS
}

/// Loads `--policy` and `--collateral` (clap requires both or neither).
fn load_binding_inputs(a: &VerifyArgs) -> anyhow::Result<Option<(LoadedPolicy, CollateralBundle)>> {
    let (Some(policy), Some(collateral)) = (&a.policy, &a.collateral) else {
        return Ok(None);
    };
    let policy = LoadedPolicy::from_file(policy)
        .with_context(|| format!("--policy {}", policy.display()))?;
    let collateral = CollateralBundle::from_file(collateral)
        .with_context(|| format!("--collateral {}", collateral.display()))?;
    Ok(Some((policy, collateral)))
}

/// Reads every intact record of a log.
fn read_records(dir: &Path) -> anyhow::Result<Vec<(Record, Vec<u8>)>> {
    require_dir(dir)?;
    let records = inferno_audit::read_records(dir)
        .map_err(|e| anyhow::anyhow!("{e} (run `inferno audit verify`)"))?;
    Ok(records.into_iter().map(|r| (r.record, r.payload)).collect())
}

fn parse_time(s: &Option<String>, flag: &str) -> anyhow::Result<Option<OffsetDateTime>> {
    s.as_deref()
        .map(|t| {
            OffsetDateTime::parse(t, &Rfc3339)
                .with_context(|| format!("{flag} {t:?} is not RFC 3339"))
        })
        .transpose()
}

fn show(a: &ShowArgs) -> anyhow::Result<()> {
    let since = parse_time(&a.since, "--since")?;
    let until = parse_time(&a.until, "--until")?;
    let decrypt = match &a.decrypt_key {
        Some(p) => {
            let key = read_key_file(p)?;
            Some(ContentPolicy::new(ContentMode::Encrypted, Some(&key))?)
        }
        None => None,
    };
    let records = read_records(&a.dir)?;
    let principal_requests: std::collections::HashSet<String> = match &a.principal {
        Some(p) => records
            .iter()
            .filter_map(|(r, _)| match &r.body {
                RecordBody::Request(q) if &q.principal == p => Some(q.request_id.clone()),
                _ => None,
            })
            .collect(),
        None => Default::default(),
    };
    let mut stdout = std::io::stdout().lock();
    for (record, _) in records {
        if since.is_some_and(|s| record.time < s) || until.is_some_and(|u| record.time >= u) {
            continue;
        }
        if a.principal.is_some()
            && !record
                .body
                .request_id()
                .is_some_and(|id| principal_requests.contains(id))
        {
            continue;
        }
        if a.request_id
            .as_deref()
            .is_some_and(|id| record.body.request_id() != Some(id))
        {
            continue;
        }
        if a.event_type
            .as_deref()
            .is_some_and(|t| record.body.kind() != t)
        {
            continue;
        }
        let mut value = serde_json::to_value(&record)?;
        if let Some(policy) = &decrypt {
            add_plaintext(policy, &record, &mut value)?;
        }
        writeln!(stdout, "{value}")?;
    }
    Ok(())
}

fn add_plaintext(
    policy: &ContentPolicy,
    record: &Record,
    value: &mut serde_json::Value,
) -> anyhow::Result<()> {
    let (label, id, content) = match &record.body {
        RecordBody::Request(r) => ("prompt", &r.request_id, &r.prompt),
        RecordBody::Completion(c) => ("completion", &c.request_id, &c.completion),
        RecordBody::Event(_) => return Ok(()),
    };
    if let Some(text) = policy
        .open(label, id, content)
        .with_context(|| format!("record {}", record.index))?
    {
        value[label]["plaintext"] = serde_json::Value::String(text.to_string());
    }
    Ok(())
}

const CSV_COLUMNS: [&str; 14] = [
    "index",
    "time",
    "type",
    "event",
    "request_id",
    "principal",
    "endpoint",
    "model_digest",
    "prompt_tokens",
    "completion_tokens",
    "finish_reason",
    "status",
    "latency_ms",
    "details",
];

fn csv_row(record: &Record) -> anyhow::Result<Vec<String>> {
    let time = record.time.format(&Rfc3339)?;
    let mut row = vec![record.index.to_string(), time];
    let empty = String::new;
    match &record.body {
        RecordBody::Request(r) => row.extend([
            "request".into(),
            empty(),
            r.request_id.clone(),
            r.principal.clone(),
            r.endpoint.clone(),
            r.model_digest.clone(),
            empty(),
            empty(),
            empty(),
            r.status.map(|s| s.to_string()).unwrap_or_default(),
            empty(),
            serde_json::to_string(&r.prompt)?,
        ]),
        RecordBody::Completion(c) => row.extend([
            "completion".into(),
            empty(),
            c.request_id.clone(),
            empty(),
            empty(),
            empty(),
            c.prompt_tokens.to_string(),
            c.completion_tokens.to_string(),
            c.finish_reason.clone().unwrap_or_default(),
            c.status.to_string(),
            c.latency_ms.to_string(),
            serde_json::to_string(&c.completion)?,
        ]),
        RecordBody::Event(e) => {
            row.extend(["event".into(), e.name().into()]);
            row.extend(std::iter::repeat_with(empty).take(9));
            row.push(event_details(e)?);
        }
    }
    Ok(row)
}

fn event_details(e: &SecurityEvent) -> anyhow::Result<String> {
    let mut v = serde_json::to_value(e)?;
    if let Some(map) = v.as_object_mut() {
        map.remove("event");
    }
    Ok(v.to_string())
}

fn export(a: &ExportArgs) -> anyhow::Result<()> {
    let records = read_records(&a.dir)?;
    let mut out: Box<dyn std::io::Write> = match &a.output {
        Some(p) => Box::new(std::io::BufWriter::new(
            crate::seal::create_new_file(p, 0o600)
                .with_context(|| format!("creating {}", p.display()))?,
        )),
        None => Box::new(std::io::stdout().lock()),
    };
    match a.format {
        ExportFormat::Jsonl => {
            for (_, raw) in &records {
                out.write_all(raw)?;
                out.write_all(b"\n")?;
            }
        }
        ExportFormat::Csv => {
            let mut w = csv::Writer::from_writer(&mut out);
            w.write_record(CSV_COLUMNS)?;
            for (record, _) in &records {
                w.write_record(csv_row(record)?)?;
            }
            w.flush()?;
        }
    }
    out.flush()?;
    Ok(())
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
