//! `inferno audit show` and `inferno audit export`: records filtered (by time, principal,
//! request id, status, kind) as JSON lines, or every record as JSON lines or CSV.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use sha2::{Digest as _, Sha256};
use time::format_description::well_known::Rfc3339;
use time::{Date, OffsetDateTime};

use inferno_audit::{
    ContentMode, ContentPolicy, Record, RecordBody, SealedContent, SecurityEvent, read_key_file,
};

/// Arguments of `inferno audit show`.
#[derive(Debug, clap::Args)]
pub(super) struct ShowArgs {
    /// The log directory.
    dir: PathBuf,
    #[command(flatten)]
    filter: FilterArgs,
    /// Only records of this request id: the server's (`x-request-id`) or the client's own
    /// (`client_request_id`).
    #[arg(long)]
    request_id: Option<String>,
    /// Only records of requests answered with this HTTP status (`429`) or class (`4xx`).
    #[arg(long)]
    status: Option<String>,
    /// Only records of this kind: `request`, `completion` or an event name (e.g. `started`).
    #[arg(long)]
    event_type: Option<String>,
    /// A content key file: decrypt encrypted prompts and completions.
    #[arg(long)]
    decrypt_key: Option<PathBuf>,
}

/// The time and principal filters `show` and `report` share.
#[derive(Debug, Clone, Default, clap::Args)]
pub(super) struct FilterArgs {
    /// Only records at or after this time (RFC 3339, or a date: `2026-01-31` is its midnight UTC).
    #[arg(long)]
    pub since: Option<String>,
    /// Only records before this time (RFC 3339, or a date: its midnight UTC).
    #[arg(long)]
    pub until: Option<String>,
    /// Only request records of this principal (API key id) and their completions.
    #[arg(long)]
    pub principal: Option<String>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(super) enum ExportFormat {
    Jsonl,
    Csv,
}

/// Arguments of `inferno audit export`.
#[derive(Debug, clap::Args)]
pub(super) struct ExportArgs {
    /// The log directory.
    dir: PathBuf,
    /// The output format.
    #[arg(long, value_enum)]
    format: ExportFormat,
    /// Write to this file instead of standard output.
    #[arg(long, short)]
    output: Option<PathBuf>,
}

/// Reads every intact record of a log, with its stored bytes.
pub(super) fn read_records(dir: &Path) -> anyhow::Result<Vec<(Record, Vec<u8>)>> {
    super::require_dir(dir)?;
    let records = inferno_audit::read_records(dir)
        .map_err(|e| anyhow::anyhow!("{e} (run `inferno audit verify`)"))?;
    Ok(records.into_iter().map(|r| (r.record, r.payload)).collect())
}

/// Parses `--since`/`--until`: RFC 3339, or a date (`YYYY-MM-DD`, its midnight UTC).
pub(super) fn parse_time(s: Option<&str>, flag: &str) -> anyhow::Result<Option<OffsetDateTime>> {
    let Some(t) = s else {
        return Ok(None);
    };
    if let Ok(time) = OffsetDateTime::parse(t, &Rfc3339) {
        return Ok(Some(time));
    }
    let date_format = time::macros::format_description!("[year]-[month]-[day]");
    match Date::parse(t, &date_format) {
        Ok(date) => Ok(Some(date.midnight().assume_utc())),
        Err(_) => {
            bail!("{flag} {t:?} is neither RFC 3339 (2026-01-31T08:00:00Z) nor a date (2026-01-31)")
        }
    }
}

/// What is known of each request (by the server's request id) across its records.
#[derive(Debug, Clone, Default)]
pub(super) struct RequestFacts {
    /// The API key id.
    pub principal: String,
    /// The client's own request id.
    pub client_request_id: Option<String>,
    /// The final HTTP status (the request record's, or its completion's).
    pub status: Option<u16>,
}

/// Facts per request id.
pub(super) fn request_facts<'a>(
    records: impl IntoIterator<Item = &'a Record>,
) -> HashMap<String, RequestFacts> {
    let mut facts: HashMap<String, RequestFacts> = HashMap::new();
    for record in records {
        match &record.body {
            RecordBody::Request(q) => {
                let f = facts.entry(q.request_id.clone()).or_default();
                f.principal.clone_from(&q.principal);
                f.client_request_id.clone_from(&q.client_request_id);
                if q.status.is_some() {
                    f.status = q.status;
                }
            }
            RecordBody::Completion(c) => {
                facts.entry(c.request_id.clone()).or_default().status = Some(c.status);
            }
            RecordBody::Event(_) => {}
        }
    }
    facts
}

/// A resolved set of filters.
#[derive(Debug, Default)]
pub(super) struct Filter {
    since: Option<OffsetDateTime>,
    until: Option<OffsetDateTime>,
    principal: Option<String>,
    request_id: Option<String>,
    status: Option<StatusMatch>,
    kind: Option<String>,
}

#[derive(Debug, Clone, Copy)]
enum StatusMatch {
    Exact(u16),
    Class(u16),
}

impl StatusMatch {
    fn parse(s: &str) -> anyhow::Result<Self> {
        let lower = s.to_ascii_lowercase();
        if let Some(class) = lower.strip_suffix("xx")
            && let Ok(c @ 1..=5) = class.parse::<u16>()
        {
            return Ok(Self::Class(c));
        }
        match s.parse::<u16>() {
            Ok(code @ 100..=599) => Ok(Self::Exact(code)),
            _ => bail!("--status {s:?} is neither an HTTP status (429) nor a class (4xx)"),
        }
    }

    fn matches(self, status: u16) -> bool {
        match self {
            Self::Exact(c) => status == c,
            Self::Class(c) => status / 100 == c,
        }
    }
}

/// The record kinds `--event-type` accepts.
fn known_kinds() -> Vec<&'static str> {
    let mut kinds = vec!["request", "completion"];
    kinds.extend(SecurityEvent::NAMES);
    kinds
}

impl Filter {
    /// The time and principal filters.
    pub(super) fn from_args(args: &FilterArgs) -> anyhow::Result<Self> {
        Ok(Self {
            since: parse_time(args.since.as_deref(), "--since")?,
            until: parse_time(args.until.as_deref(), "--until")?,
            principal: args.principal.clone(),
            ..Self::default()
        })
    }

    fn for_show(a: &ShowArgs) -> anyhow::Result<Self> {
        let mut filter = Self::from_args(&a.filter)?;
        filter.request_id.clone_from(&a.request_id);
        filter.status = a.status.as_deref().map(StatusMatch::parse).transpose()?;
        if let Some(kind) = &a.event_type {
            let known = known_kinds();
            if !known.contains(&kind.as_str()) {
                bail!(
                    "--event-type {kind:?} is not a record kind; known kinds: {}",
                    known.join(", ")
                );
            }
            filter.kind = Some(kind.clone());
        }
        Ok(filter)
    }

    /// Whether `record` is within `--since` and `--until`.
    pub(super) fn keeps_time(&self, record: &Record) -> bool {
        !(self.since.is_some_and(|s| record.time < s)
            || self.until.is_some_and(|u| record.time >= u))
    }

    /// Whether `record` passes, given the facts of every request.
    pub(super) fn keeps(&self, record: &Record, facts: &HashMap<String, RequestFacts>) -> bool {
        if !self.keeps_time(record) {
            return false;
        }
        if self
            .kind
            .as_deref()
            .is_some_and(|k| record.body.kind() != k)
        {
            return false;
        }
        let fact = record.body.request_id().and_then(|id| facts.get(id));
        if let Some(p) = &self.principal
            && fact.is_none_or(|f| &f.principal != p)
        {
            return false;
        }
        if let Some(id) = &self.request_id {
            let server = record.body.request_id() == Some(id.as_str());
            let client = fact.is_some_and(|f| f.client_request_id.as_ref() == Some(id));
            if !server && !client {
                return false;
            }
        }
        if let Some(status) = self.status
            && !fact
                .and_then(|f| f.status)
                .is_some_and(|s| status.matches(s))
        {
            return false;
        }
        true
    }
}

/// Runs `f` on standard output or a file; a reader that closed the pipe ends it quietly.
fn write_out(
    output: Option<&Path>,
    f: impl FnOnce(&mut dyn std::io::Write) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let result = match output {
        Some(p) => {
            // Records hold request metadata: the file is private whatever the umask (issue 47).
            let file = std::os::unix::fs::OpenOptionsExt::mode(
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true),
                0o600,
            )
            .open(p)
            .with_context(|| format!("creating {}", p.display()))?;
            let mut out = std::io::BufWriter::new(file);
            f(&mut out).and_then(|()| out.flush().map_err(Into::into))
        }
        None => {
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            f(&mut out).and_then(|()| out.flush().map_err(Into::into))
        }
    };
    match result {
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
                    || c.downcast_ref::<csv::Error>().is_some_and(|ce| {
                        matches!(ce.kind(), csv::ErrorKind::Io(io) if io.kind() == std::io::ErrorKind::BrokenPipe)
                    })
            }) =>
        {
            Ok(())
        }
        other => other,
    }
}

/// `inferno audit show`.
pub(super) fn show(a: &ShowArgs) -> anyhow::Result<()> {
    let filter = Filter::for_show(a)?;
    let decrypt = match &a.decrypt_key {
        Some(p) => {
            let key = read_key_file(p)?;
            Some(ContentPolicy::new(ContentMode::Encrypted, Some(&key))?)
        }
        None => None,
    };
    let records = read_records(&a.dir)?;
    let facts = request_facts(records.iter().map(|(r, _)| r));
    write_out(None, |out| {
        for (record, _) in &records {
            if !filter.keeps(record, &facts) {
                continue;
            }
            let mut value = serde_json::to_value(record)?;
            if let Some(policy) = &decrypt {
                add_plaintext(policy, record, &mut value)?;
            }
            writeln!(out, "{value}")?;
        }
        Ok(())
    })
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

/// The CSV columns: every scalar field of every record kind. Large values (sealed content,
/// evidence) appear as the SHA-256 of their stored JSON.
pub(super) const CSV_COLUMNS: [&str; 44] = [
    "index",
    "time",
    "type",
    "event",
    "request_id",
    "client_request_id",
    "principal",
    "endpoint",
    "model_digest",
    "stream",
    "status",
    "constraint_kind",
    "grammar_digest",
    "prompt_mode",
    "prompt_hmac",
    "prompt_sha256",
    "prompt_tokens",
    "completion_tokens",
    "finish_reason",
    "latency_ms",
    "completion_mode",
    "completion_hmac",
    "completion_sha256",
    "software_version",
    "checkpoint_key",
    "evidence_kinds",
    "evidence_sha256",
    "reason",
    "previous",
    "current",
    "subject",
    "report_digest",
    "passed",
    "detail",
    "key_id",
    "released",
    "policy_digest",
    "config_digest",
    "content_mode",
    "ready",
    "certificate_digest",
    "segment",
    "offset",
    "truncated_bytes",
];

fn json_sha256<T: serde::Serialize>(value: &T) -> anyhow::Result<String> {
    Ok(hex::encode(Sha256::digest(serde_json::to_vec(value)?)))
}

fn content_cells(
    row: &mut HashMap<&'static str, String>,
    prefix: [&'static str; 3],
    content: &SealedContent,
) -> anyhow::Result<()> {
    let (mode, hmac) = match content {
        SealedContent::None => ("none", String::new()),
        SealedContent::Hmac { hmac } => ("hmac", hmac.clone()),
        SealedContent::Encrypted { .. } => ("encrypted", String::new()),
    };
    row.insert(prefix[0], mode.into());
    row.insert(prefix[1], hmac);
    if !matches!(content, SealedContent::None) {
        row.insert(prefix[2], json_sha256(content)?);
    }
    Ok(())
}

fn event_cells(row: &mut HashMap<&'static str, String>, e: &SecurityEvent) -> anyhow::Result<()> {
    let opt = |o: &Option<String>| o.clone().unwrap_or_default();
    match e {
        SecurityEvent::Started {
            software_version,
            checkpoint_key,
            evidence,
        } => {
            row.insert("software_version", software_version.clone());
            row.insert("checkpoint_key", checkpoint_key.clone());
            let kinds: Vec<&str> = evidence.iter().map(|b| b.kind.as_str()).collect();
            row.insert("evidence_kinds", kinds.join(";"));
            row.insert("evidence_sha256", json_sha256(evidence)?);
        }
        SecurityEvent::Stopped { reason } => {
            row.insert("reason", reason.clone());
        }
        SecurityEvent::SigningKeyChanged { previous, current } => {
            row.insert("previous", opt(previous));
            row.insert("current", current.clone());
        }
        SecurityEvent::Appraisal {
            subject,
            report_digest,
            passed,
            detail,
        } => {
            row.insert("subject", subject.clone());
            row.insert("report_digest", report_digest.clone());
            row.insert("passed", passed.to_string());
            row.insert("detail", detail.clone());
        }
        SecurityEvent::KeyRelease {
            key_id,
            released,
            reason,
        } => {
            row.insert("key_id", key_id.clone());
            row.insert("released", released.to_string());
            row.insert("reason", reason.clone());
        }
        SecurityEvent::PolicyConfig {
            policy_digest,
            config_digest,
            content_mode,
        } => {
            row.insert("policy_digest", opt(policy_digest));
            row.insert("config_digest", opt(config_digest));
            row.insert("content_mode", content_mode.clone());
        }
        SecurityEvent::GpuReady { ready, detail } => {
            row.insert("ready", ready.to_string());
            row.insert("detail", detail.clone());
        }
        SecurityEvent::CertificateRotated { certificate_digest } => {
            row.insert("certificate_digest", certificate_digest.clone());
        }
        SecurityEvent::Recovery {
            segment,
            offset,
            truncated_bytes,
            reason,
        } => {
            row.insert("segment", segment.clone());
            row.insert("offset", offset.to_string());
            row.insert("truncated_bytes", truncated_bytes.to_string());
            row.insert("reason", reason.clone());
        }
    }
    Ok(())
}

/// One CSV row; completion rows carry their request's principal.
pub(super) fn csv_row(
    record: &Record,
    facts: &HashMap<String, RequestFacts>,
) -> anyhow::Result<Vec<String>> {
    let mut row: HashMap<&'static str, String> = HashMap::new();
    row.insert("index", record.index.to_string());
    row.insert("time", record.time.format(&Rfc3339)?);
    match &record.body {
        RecordBody::Request(r) => {
            row.insert("type", "request".into());
            row.insert("request_id", r.request_id.clone());
            row.insert(
                "client_request_id",
                r.client_request_id.clone().unwrap_or_default(),
            );
            row.insert("principal", r.principal.clone());
            row.insert("endpoint", r.endpoint.clone());
            row.insert("model_digest", r.model_digest.clone());
            row.insert("stream", r.stream.to_string());
            row.insert(
                "status",
                r.status.map(|s| s.to_string()).unwrap_or_default(),
            );
            if let Some(c) = &r.constraint {
                row.insert("constraint_kind", c.kind.clone());
                row.insert("grammar_digest", c.grammar_digest.clone());
            }
            content_cells(
                &mut row,
                ["prompt_mode", "prompt_hmac", "prompt_sha256"],
                &r.prompt,
            )?;
        }
        RecordBody::Completion(c) => {
            row.insert("type", "completion".into());
            row.insert("request_id", c.request_id.clone());
            if let Some(f) = facts.get(&c.request_id) {
                row.insert("principal", f.principal.clone());
                row.insert(
                    "client_request_id",
                    f.client_request_id.clone().unwrap_or_default(),
                );
            }
            row.insert("prompt_tokens", c.prompt_tokens.to_string());
            row.insert("completion_tokens", c.completion_tokens.to_string());
            row.insert("finish_reason", c.finish_reason.clone().unwrap_or_default());
            row.insert("status", c.status.to_string());
            row.insert("latency_ms", c.latency_ms.to_string());
            content_cells(
                &mut row,
                ["completion_mode", "completion_hmac", "completion_sha256"],
                &c.completion,
            )?;
        }
        RecordBody::Event(e) => {
            row.insert("type", "event".into());
            row.insert("event", e.name().into());
            event_cells(&mut row, e)?;
        }
    }
    Ok(CSV_COLUMNS
        .iter()
        .map(|c| row.remove(c).unwrap_or_default())
        .collect())
}

/// Writes every record of `records` as CSV.
pub(super) fn write_csv(
    out: &mut dyn std::io::Write,
    records: &[(Record, Vec<u8>)],
) -> anyhow::Result<()> {
    let facts = request_facts(records.iter().map(|(r, _)| r));
    let mut w = csv::Writer::from_writer(out);
    w.write_record(CSV_COLUMNS)?;
    for (record, _) in records {
        w.write_record(csv_row(record, &facts)?)?;
    }
    w.flush()?;
    Ok(())
}

/// `inferno audit export`.
pub(super) fn export(a: &ExportArgs) -> anyhow::Result<()> {
    let records = read_records(&a.dir)?;
    write_out(a.output.as_deref(), |out| match a.format {
        ExportFormat::Jsonl => {
            for (_, raw) in &records {
                out.write_all(raw)?;
                out.write_all(b"\n")?;
            }
            Ok(())
        }
        ExportFormat::Csv => write_csv(out, &records),
    })
}
