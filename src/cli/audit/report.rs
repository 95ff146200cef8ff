//! `inferno audit report`: one self-contained HTML file for a compliance officer. No script,
//! no external resource (a Content-Security-Policy meta tag forbids every fetch), charts drawn
//! here as inline SVG. Every count can be recomputed from `inferno audit export`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::Serialize;
use sha2::{Digest as _, Sha256};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use inferno_audit::note::SignedNote;
use inferno_audit::{Record, RecordBody, SecurityEvent, stored_checkpoints};

use super::records::{Filter, FilterArgs, RequestFacts, request_facts};
use super::summary::Summary;

const TEMPLATE: &str = include_str!("report.html");

const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:76em;color:#1b1b1b;padding:0 1em}\
h1{font-size:1.6em}h2{border-bottom:2px solid #ccc;margin-top:2em}\
table{border-collapse:collapse;margin:.6em 0;width:100%}th,td{border:1px solid #ddd;padding:.25em .5em;text-align:left;vertical-align:top}\
th{background:#f3f3f3}td.n{text-align:right;font-variant-numeric:tabular-nums}code{font-size:.9em;word-break:break-all}\
.verdict{font-size:1.3em;font-weight:bold;padding:.5em;border-radius:4px}.intact{background:#e3f5e1;color:#14532d}.violation{background:#fde2e1;color:#7f1d1d}\
.att.simulated,.att.failed{color:#b91c1c;font-weight:bold}.att.passed{color:#166534}\
tr.alert td{background:#fff4e5}.note{color:#555;font-size:.9em}pre{background:#f6f6f6;padding:.8em;overflow-x:auto}\
svg text{font:11px system-ui,sans-serif}";

/// Arguments of `inferno audit report`.
#[derive(Debug, clap::Args)]
pub(super) struct ReportArgs {
    /// The log directory.
    pub dir: PathBuf,
    /// Where to write the HTML file.
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub filter: FilterArgs,
    #[command(flatten)]
    pub verify: super::VerifyInputs,
}

/// One row of section 2.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub(super) struct DayRow {
    day: String,
    principal: String,
    requests: u64,
    s2xx: u64,
    s4xx: u64,
    s5xx: u64,
    other: u64,
    prompt_tokens: u64,
    completion_tokens: u64,
}

#[derive(Debug, Clone, Serialize)]
struct ReasonRow {
    status: u16,
    reason: String,
    endpoint: String,
    count: u64,
    principals: String,
}

#[derive(Debug, Clone, Serialize)]
struct EventRow {
    index: u64,
    time: String,
    name: &'static str,
    text: String,
    class: &'static str,
}

#[derive(Debug, Clone, Serialize)]
struct ChainRow {
    n: usize,
    size: u64,
    root: String,
    covers_until: Option<String>,
    signers: String,
}

/// What the template reads.
#[derive(Serialize)]
struct Context<'a> {
    s: &'a Summary,
    csp: String,
    style: &'static str,
    generated: String,
    version: &'static str,
    filters: String,
    gap_seconds: u64,
    chart: String,
    per_day: Vec<DayRow>,
    refusals: Vec<ReasonRow>,
    events: Vec<EventRow>,
    chain: Vec<ChainRow>,
    chain_omitted: usize,
    commands: Vec<String>,
}

/// The most checkpoints the chain table lists (the newest).
const CHAIN_ROWS: usize = 200;

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_else(|_| t.to_string())
}

/// Section 2: per day and principal, from the request records that pass `filter`.
fn per_day(
    records: &[Record],
    facts: &HashMap<String, RequestFacts>,
    filter: &Filter,
) -> Vec<DayRow> {
    let tokens: HashMap<&str, (u64, u64)> = records
        .iter()
        .filter_map(|r| match &r.body {
            RecordBody::Completion(c) => Some((
                c.request_id.as_str(),
                (c.prompt_tokens, c.completion_tokens),
            )),
            _ => None,
        })
        .collect();
    let mut rows: BTreeMap<(String, String), DayRow> = BTreeMap::new();
    for r in records {
        let RecordBody::Request(q) = &r.body else {
            continue;
        };
        if !filter.keeps(r, facts) {
            continue;
        }
        let day = rfc3339(r.time).chars().take(10).collect::<String>();
        let row = rows
            .entry((day.clone(), q.principal.clone()))
            .or_insert_with(|| DayRow {
                day,
                principal: q.principal.clone(),
                ..DayRow::default()
            });
        row.requests += 1;
        match facts.get(&q.request_id).and_then(|f| f.status) {
            Some(200..=299) => row.s2xx += 1,
            Some(400..=499) => row.s4xx += 1,
            Some(500..=599) => row.s5xx += 1,
            _ => row.other += 1,
        }
        if let Some((p, c)) = tokens.get(q.request_id.as_str()) {
            row.prompt_tokens += p;
            row.completion_tokens += c;
        }
    }
    rows.into_values().collect()
}

/// Section 3: requests answered 4xx or 5xx, by status and endpoint.
fn refusals(
    records: &[Record],
    facts: &HashMap<String, RequestFacts>,
    filter: &Filter,
) -> Vec<ReasonRow> {
    let mut groups: BTreeMap<(u16, String), (u64, BTreeSet<String>)> = BTreeMap::new();
    for r in records {
        let RecordBody::Request(q) = &r.body else {
            continue;
        };
        if !filter.keeps(r, facts) {
            continue;
        }
        let Some(status) = facts.get(&q.request_id).and_then(|f| f.status) else {
            continue;
        };
        if status < 400 {
            continue;
        }
        let g = groups.entry((status, q.endpoint.clone())).or_default();
        g.0 += 1;
        g.1.insert(q.principal.clone());
    }
    groups
        .into_iter()
        .map(|((status, endpoint), (count, principals))| ReasonRow {
            status,
            reason: http::StatusCode::from_u16(status)
                .ok()
                .and_then(|s| s.canonical_reason())
                .unwrap_or("")
                .to_owned(),
            endpoint,
            count,
            principals: principals.into_iter().collect::<Vec<_>>().join(", "),
        })
        .collect()
}

fn event_text(e: &SecurityEvent) -> (String, bool) {
    match e {
        SecurityEvent::Started {
            software_version,
            checkpoint_key,
            evidence,
        } => (
            format!(
                "version {software_version}, checkpoint key {checkpoint_key}, {} evidence blob(s)",
                evidence.len()
            ),
            false,
        ),
        SecurityEvent::Stopped { reason } => (format!("stopped: {reason}"), false),
        SecurityEvent::SigningKeyChanged { previous, current } => (
            format!(
                "signing key changed from {} to {current}",
                previous.as_deref().unwrap_or("none")
            ),
            false,
        ),
        SecurityEvent::Appraisal {
            subject,
            report_digest,
            passed,
            detail,
        } => (
            format!(
                "{subject} appraisal {}: {detail} (report sha256 {report_digest})",
                if *passed { "passed" } else { "FAILED" }
            ),
            !passed || detail.contains("SIMULATED"),
        ),
        SecurityEvent::KeyRelease {
            key_id,
            released,
            reason,
        } => (
            format!(
                "key {key_id} {}: {reason}",
                if *released { "released" } else { "REFUSED" }
            ),
            !released,
        ),
        SecurityEvent::PolicyConfig {
            policy_digest,
            config_digest,
            content_mode,
        } => (
            format!(
                "policy sha256 {}, configuration sha256 {}, content mode {content_mode}",
                policy_digest.as_deref().unwrap_or("-"),
                config_digest.as_deref().unwrap_or("-")
            ),
            false,
        ),
        SecurityEvent::GpuReady { ready, detail } => (
            format!(
                "{}: {detail}",
                if *ready { "GPU ready" } else { "no GPU ready" }
            ),
            false,
        ),
        SecurityEvent::CertificateRotated { certificate_digest } => (
            format!("TLS certificate sha256 {certificate_digest}"),
            false,
        ),
        SecurityEvent::Recovery {
            segment,
            offset,
            truncated_bytes,
            reason,
        } => (
            format!(
                "recovered {segment} at offset {offset}, {truncated_bytes} bytes removed: {reason}"
            ),
            true,
        ),
    }
}

/// Section 4: every security event within the time filter, in log order.
fn events(records: &[Record], filter: &Filter) -> Vec<EventRow> {
    records
        .iter()
        .filter_map(|r| match &r.body {
            RecordBody::Event(e) if filter.keeps_time(r) => {
                let (text, alert) = event_text(e);
                Some(EventRow {
                    index: r.index,
                    time: rfc3339(r.time),
                    name: e.name(),
                    text,
                    class: if alert { "alert" } else { "" },
                })
            }
            _ => None,
        })
        .collect()
}

/// Section 5: the stored checkpoints (the newest [`CHAIN_ROWS`]) and how many were left out.
fn chain(dir: &Path, records: &[Record], first_index: u64) -> (Vec<ChainRow>, usize) {
    let notes = stored_checkpoints(dir).unwrap_or_default();
    let skip = notes.len().saturating_sub(CHAIN_ROWS);
    let rows = notes
        .iter()
        .enumerate()
        .skip(skip)
        .filter_map(|(n, text)| {
            let note = SignedNote::parse(text).ok()?;
            let cp = note.checkpoint().ok()?;
            let covers_until = cp
                .size
                .checked_sub(1)
                .and_then(|i| i.checked_sub(first_index))
                .and_then(|i| records.get(usize::try_from(i).ok()?))
                .map(|r| rfc3339(r.time));
            Some(ChainRow {
                n,
                size: cp.size,
                root: B64.encode(cp.root),
                covers_until,
                signers: note
                    .signatures
                    .iter()
                    .map(|s| s.name.clone())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
        })
        .collect();
    (rows, skip)
}

/// A stacked bar chart of requests per day by status class, as inline SVG.
fn chart(rows: &[DayRow]) -> String {
    let mut days: BTreeMap<&str, [u64; 4]> = BTreeMap::new();
    for r in rows {
        let d = days.entry(r.day.as_str()).or_default();
        d[0] += r.s2xx;
        d[1] += r.s4xx;
        d[2] += r.s5xx;
        d[3] += r.other;
    }
    if days.is_empty() {
        return String::new();
    }
    let max = days
        .values()
        .map(|d| d.iter().sum::<u64>())
        .max()
        .unwrap_or(1)
        .max(1);
    let (bar, gap, height, top, left, bottom) = (28u64, 12u64, 160u64, 16u64, 48u64, 40u64);
    let width = left + days.len() as u64 * (bar + gap) + gap + 120;
    let total_h = top + height + bottom;
    let mut svg = String::new();
    let _ = write!(
        svg,
        "<svg id=\"chart-per-day\" role=\"img\" aria-label=\"Requests per day by status class\" \
         xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{total_h}\" viewBox=\"0 0 {width} {total_h}\">"
    );
    let _ = write!(
        svg,
        "<line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{}\" stroke=\"#888\"/>\
         <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{max}</text>\
         <text x=\"{}\" y=\"{}\" text-anchor=\"end\">0</text>",
        top + height,
        left - 4,
        top + 4,
        left - 4,
        top + height
    );
    let colours = ["#2f855a", "#dd6b20", "#c53030", "#a0aec0"];
    for (i, (day, counts)) in days.iter().enumerate() {
        let x = left + gap + i as u64 * (bar + gap);
        let mut y = top + height;
        for (count, colour) in counts.iter().zip(colours) {
            let h = count * height / max;
            if h == 0 {
                continue;
            }
            y -= h;
            let _ = write!(
                svg,
                "<rect x=\"{x}\" y=\"{y}\" width=\"{bar}\" height=\"{h}\" fill=\"{colour}\"><title>{day}: {count}</title></rect>"
            );
        }
        let _ = write!(
            svg,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            x + bar / 2,
            top + height + 14,
            day.get(5..).unwrap_or(day)
        );
    }
    let legend_x = width - 110;
    for (i, (label, colour)) in ["2xx", "4xx", "5xx", "other"]
        .iter()
        .zip(colours)
        .enumerate()
    {
        let y = top + i as u64 * 18;
        let _ = write!(
            svg,
            "<rect x=\"{legend_x}\" y=\"{y}\" width=\"12\" height=\"12\" fill=\"{colour}\"/>\
             <text x=\"{}\" y=\"{}\">{label}</text>",
            legend_x + 18,
            y + 10
        );
    }
    svg.push_str("</svg>");
    svg
}

/// The strict policy: nothing may be fetched; only the one inline style block applies.
fn csp() -> String {
    let style_hash = B64.encode(Sha256::digest(STYLE.as_bytes()));
    format!(
        "default-src 'none'; style-src 'sha256-{style_hash}'; img-src 'none'; script-src 'none'; \
         base-uri 'none'; form-action 'none'"
    )
}

fn shell_quote(s: &str) -> String {
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-=:+@".contains(c))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Renders the report of an already verified log.
pub(super) fn render(
    summary: &Summary,
    records: &[Record],
    dir: &Path,
    filter_args: &FilterArgs,
    verify_flags: &[String],
    gap_seconds: u64,
) -> anyhow::Result<String> {
    let filter = Filter::from_args(filter_args)?;
    let facts = request_facts(records);
    let per_day = per_day(records, &facts, &filter);
    let first_index = summary.records.first_index;
    let (chain, chain_omitted) = chain(dir, records, first_index);
    let d = shell_quote(&dir.display().to_string());
    let mut verify_cmd = format!("inferno audit verify {d}");
    for f in verify_flags {
        verify_cmd.push(' ');
        verify_cmd.push_str(&shell_quote(f));
    }
    let mut narrowing = Vec::new();
    let mut filters = Vec::new();
    for (flag, v) in [
        ("--since", &filter_args.since),
        ("--until", &filter_args.until),
        ("--principal", &filter_args.principal),
    ] {
        if let Some(v) = v {
            narrowing.push(format!("{flag} {}", shell_quote(v)));
            filters.push(format!("{flag} {v}"));
        }
    }
    let narrowing = narrowing.join(" ");
    let commands = vec![
        verify_cmd.clone(),
        format!("{verify_cmd} --json > verify.json"),
        format!("inferno audit export {d} --format csv -o records.csv"),
        format!("inferno audit show {d} {narrowing}")
            .trim_end()
            .to_owned(),
        format!("inferno audit report {d} --out report.html {narrowing}")
            .trim_end()
            .to_owned(),
    ];
    let mut env = minijinja::Environment::new();
    env.add_template("report.html", TEMPLATE)?;
    let refusals = refusals(records, &facts, &filter);
    let context = Context {
        s: summary,
        csp: csp(),
        style: STYLE,
        generated: rfc3339(OffsetDateTime::now_utc()),
        version: env!("CARGO_PKG_VERSION"),
        filters: filters.join(", "),
        gap_seconds,
        chart: chart(&per_day),
        per_day,
        refusals,
        events: events(records, &filter),
        chain,
        chain_omitted,
        commands,
    };
    let html = env
        .get_template("report.html")?
        .render(minijinja::Value::from(minijinja::value::Serde(&context)))?;
    Ok(html)
}

/// `inferno audit report`: verifies the log, then writes the report (whatever the verdict:
/// a violation is the report's first line). Exit 1 on a violation, as `verify`.
pub(super) fn run(a: &ReportArgs) -> anyhow::Result<bool> {
    let checked = super::verify_with(&a.dir, &a.verify)?;
    let html = render(
        &checked.summary,
        &checked.records,
        &a.dir,
        &a.filter,
        &a.verify.flags(),
        a.verify.gap_seconds,
    )?;
    std::fs::write(&a.out, html).with_context(|| format!("writing {}", a.out.display()))?;
    println!("{}", checked.summary.verdict_line);
    println!("report written to {}", a.out.display());
    Ok(checked.failed)
}
