//! `inferno audit evidence-pack`: one tar file for an external auditor: the log, the witness's
//! cosigned checkpoint, the verification transcript, the report, the policies and reference
//! values in force, a manifest of SHA-256 digests and a README on verifying it offline.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use sha2::{Digest as _, Sha256};

use super::records::FilterArgs;

/// The directory every file of the pack sits in.
const ROOT: &str = "inferno-evidence";

/// Arguments of `inferno audit evidence-pack`.
#[derive(Debug, clap::Args)]
pub(super) struct PackArgs {
    /// The log directory (a stopped log, or a copy of one).
    dir: PathBuf,
    /// Where to write the tar file.
    #[arg(long)]
    out: PathBuf,
    #[command(flatten)]
    verify: super::VerifyInputs,
    /// The server policy in force (TOML), copied into the pack (repeatable, one per run).
    #[arg(long)]
    server_policy: Vec<PathBuf>,
    /// The client policy the organisation's clients use, copied into the pack (repeatable).
    #[arg(long)]
    client_policy: Vec<PathBuf>,
    /// Reference values in force (e.g. measurements), copied into the pack (repeatable).
    #[arg(long)]
    reference_values: Vec<PathBuf>,
}

/// The pack's files, in order: path inside [`ROOT`], content.
struct Contents(Vec<(String, Vec<u8>)>);

impl Contents {
    fn add(&mut self, path: String, bytes: Vec<u8>) -> anyhow::Result<()> {
        if self.0.iter().any(|(p, _)| p == &path) {
            bail!("two files would be packed as {path}: rename one");
        }
        self.0.push((path, bytes));
        Ok(())
    }

    fn add_file(&mut self, folder: &str, file: &Path) -> anyhow::Result<String> {
        let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
        let name = file
            .file_name()
            .with_context(|| format!("{} names no file", file.display()))?
            .to_string_lossy()
            .into_owned();
        let path = format!("{folder}/{name}");
        self.add(path.clone(), bytes)?;
        Ok(path)
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn readme(
    summary: &super::summary::Summary,
    verify_flags: &str,
    extra: &[(String, String)],
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Inferno audit evidence pack\n");
    let _ = writeln!(
        s,
        "Made by `inferno {}` from the audit log `{}` (origin `{}`).\n\nVerdict when packed: **{}**\n",
        env!("CARGO_PKG_VERSION"),
        summary.log.dir,
        summary.origin.as_deref().unwrap_or("-"),
        summary.verdict_line
    );
    s.push_str(
        "## Contents\n\n\
         - `log/`: the audit log as stored: segment files (`*.seg`), `checkpoints.log` (the signed \
         checkpoints) and, after a prune, `prune-anchor.json`.\n\
         - `witness/`: the witness-cosigned checkpoint the log was checked against and the witness \
         keys required, when given.\n\
         - `verify.json`, `verify.txt`: the verification transcript (`inferno audit verify --json`, \
         and as text).\n\
         - `report.html`: the report for reading in a browser (no script, nothing fetched).\n\
         - `policies/`: the server and client policies and reference values in force, as given.\n\
         - `MANIFEST.sha256`: the SHA-256 of every other file (`sha256sum -c` reads it).\n\n",
    );
    if !extra.is_empty() {
        s.push_str(
            "Policies and reference values, with their SHA-256 (compare a server policy's \
                    with the policy digest of each run in `verify.txt`):\n\n",
        );
        for (path, digest) in extra {
            let _ = writeln!(s, "- `{path}`: `{digest}`");
        }
        s.push('\n');
    }
    let _ = write!(
        s,
        "## Verifying offline\n\n\
         With a released `inferno` binary (from the project's release page, checked against its \
         published digest), in this directory, with no network:\n\n\
         ```\n\
         sha256sum -c MANIFEST.sha256\n\
         ./inferno audit verify log{verify_flags}\n\
         ./inferno audit verify log{verify_flags} --json > my-verify.json\n\
         ```\n\n\
         The second command must exit 0 and print `INTACT` with the record and checkpoint counts of \
         `verify.txt`; the third gives the same facts as `verify.json` (the `log.dir` field and \
         file paths aside). `./inferno audit report log --out my-report.html` rebuilds the report, \
         and `./inferno audit export log --format csv -o records.csv` gives every record to \
         recount it.\n\n\
         ## What vouches for this pack\n\n\
         Nobody signs this pack or its manifest: no new key is involved. Its integrity rests on \
         the log's own signed checkpoints (each run's checkpoint key is announced in the log's \
         start event, bound to that run's attestation evidence; `--policy` and `--collateral` \
         check that binding) and, when `witness/` is present, on the witness's cosignature, which \
         shows the log was not rolled back or forked. `MANIFEST.sha256` only finds damage in \
         transit: whoever can change a file can change the manifest. `verify.json`, `verify.txt` \
         and `report.html` are conveniences: re-run the commands above rather than trusting them.\n"
    );
    s
}

/// `inferno audit evidence-pack`: `true` when the log failed verification (the pack is still
/// written: it is the evidence).
pub(super) fn run(a: &PackArgs) -> anyhow::Result<bool> {
    let checked = super::verify_with(&a.dir, &a.verify)?;
    let mut contents = Contents(Vec::new());
    for f in &checked.summary.log.files {
        contents.add_file("log", &a.dir.join(&f.name))?;
    }
    let mut verify_flags = String::new();
    if let Some(t) = &a.verify.trusted_checkpoint {
        let path = contents.add_file("witness", t)?;
        let _ = write!(verify_flags, " --trusted-checkpoint {path}");
        let mut keys = String::new();
        for k in &a.verify.witness_key {
            let _ = writeln!(keys, "{k}");
            let _ = write!(verify_flags, " --witness-key '{k}'");
        }
        if !keys.is_empty() {
            contents.add("witness/witness-keys.txt".into(), keys.into_bytes())?;
        }
    }
    let mut extra = Vec::new();
    for (folder, files) in [
        ("policies/server", &a.server_policy),
        ("policies/client", &a.client_policy),
        ("policies/reference-values", &a.reference_values),
    ] {
        for f in files {
            let path = contents.add_file(folder, f)?;
            let digest = contents
                .0
                .last()
                .map(|(_, b)| sha256_hex(b))
                .unwrap_or_default();
            extra.push((path, digest));
        }
    }
    if let (Some(p), Some(c)) = (&a.verify.policy, &a.verify.collateral) {
        let p = contents.add_file("policies/attestation", p)?;
        let c = contents.add_file("policies/attestation", c)?;
        let _ = write!(verify_flags, " --policy {p} --collateral {c}");
    }
    let summary = &checked.summary;
    contents.add("verify.json".into(), serde_json::to_vec_pretty(summary)?)?;
    let mut text = String::new();
    if let Some(l) = &summary.attested {
        let _ = writeln!(text, "{l}");
    }
    let _ = writeln!(text, "{}", summary.verdict_line);
    text.push_str(&summary.render_text());
    contents.add("verify.txt".into(), text.into_bytes())?;
    let html = super::report::render(
        summary,
        &checked.records,
        &a.dir,
        &FilterArgs::default(),
        &a.verify.flags(),
        a.verify.gap_seconds,
    )?;
    contents.add("report.html".into(), html.into_bytes())?;
    contents.add(
        "README.md".into(),
        readme(summary, &verify_flags, &extra).into_bytes(),
    )?;
    let mut manifest = String::new();
    for (path, bytes) in &contents.0 {
        let _ = writeln!(manifest, "{}  {path}", sha256_hex(bytes));
    }
    contents.add("MANIFEST.sha256".into(), manifest.into_bytes())?;

    let file =
        std::fs::File::create(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let mut tar = tar::Builder::new(std::io::BufWriter::new(file));
    let now = u64::try_from(time::OffsetDateTime::now_utc().unix_timestamp()).unwrap_or(0);
    for (path, bytes) in &contents.0 {
        let mut header = tar::Header::new_ustar();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(now);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut header, format!("{ROOT}/{path}"), bytes.as_slice())
            .with_context(|| format!("packing {path}"))?;
    }
    tar.into_inner()
        .context("finishing the tar file")?
        .into_inner()
        .map_err(|e| e.into_error())
        .context("writing the tar file")?
        .sync_all()
        .context("syncing the tar file")?;
    println!("{}", summary.verdict_line);
    println!(
        "evidence pack written to {} ({} files under {ROOT}/)",
        a.out.display(),
        contents.0.len()
    );
    Ok(checked.failed)
}
