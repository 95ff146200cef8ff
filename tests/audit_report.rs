//! `inferno audit verify`'s summary, `show`/`export`'s filters and CSV, `receipt` on `prove`'s
//! output, the HTML report (its numbers against `export`, rendered in headless Chromium) and
//! the evidence pack (verified in a fresh directory with only the binary).

mod audit_support;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use audit_support::{REQUESTS, audit, stdout, write_log};

fn log_dir(tmp: &Path) -> PathBuf {
    let dir = tmp.join("log");
    write_log(&dir);
    dir
}

fn ok(out: &std::process::Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout: {}\nstderr: {}",
        stdout(out),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout(out)
}

#[test]
fn verify_prints_a_summary_and_json() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = log_dir(tmp.path());
    let d = dir.to_str().expect("utf8");
    let text = ok(&audit(&["verify", d]));
    let total = 1 + 3 + REQUESTS.len() + 6 + 1 + 1;
    assert!(
        text.starts_with(&format!("INTACT: {total} records")),
        "{text}"
    );
    for needle in [
        "time span: ",
        "checkpoints: ",
        "last checkpoint: size ",
        "run from record 0 at ",
        "version report-test",
        "attestation SIMULATED",
        "witness: not checked",
        "gaps: none",
        "file checkpoints.log (",
    ] {
        assert!(text.contains(needle), "{needle:?} in {text}");
    }

    let json: serde_json::Value =
        serde_json::from_str(&ok(&audit(&["verify", d, "--json"]))).expect("json");
    assert_eq!(json["verdict"], "INTACT");
    assert_eq!(json["records"]["total"], total);
    assert_eq!(json["records"]["requests"], REQUESTS.len());
    assert_eq!(json["last_checkpoint"]["size"], total);
    let run = &json["runs"][0];
    assert_eq!(run["attestation"], "SIMULATED");
    assert_eq!(run["software_version"], "report-test");
    assert_eq!(run["policy_digest"], "cd".repeat(32));
    assert_eq!(run["model_digest"], "ef".repeat(32));
    assert!(
        run["stopped"]
            .as_str()
            .expect("stopped")
            .contains("report test")
    );
    assert!(json["witness"].is_null());
    assert_eq!(json["gaps"].as_array().expect("gaps").len(), 0);
    assert!(
        json["log"]["files"]
            .as_array()
            .expect("files")
            .iter()
            .any(|f| f["name"] == "0000000000000000.seg" && f["sha256"].as_str().is_some())
    );

    // A violation is reported in the JSON too, with exit 1.
    std::fs::remove_file(dir.join("checkpoints.log")).expect("rm");
    let bad = audit(&["verify", d, "--json"]);
    assert_eq!(bad.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_str(&stdout(&bad)).expect("json");
    assert_eq!(json["verdict"], "VIOLATION");
    assert!(
        json["violation"]
            .as_str()
            .expect("violation")
            .contains("has no checkpoints.log")
    );
    // The report of such a log leads with the violation, and exits 1 as verify does.
    let page = tmp.path().join("violation.html");
    let out = audit(&["report", d, "--out", page.to_str().expect("utf8")]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let html = std::fs::read_to_string(&page).expect("report");
    assert!(html.contains("data-verdict=\"VIOLATION\""), "{html}");
}

fn json_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

#[test]
fn show_filters_by_either_request_id_status_and_date() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = log_dir(tmp.path());
    let d = dir.to_str().expect("utf8");
    let show = |args: &[&str]| {
        let mut all = vec!["show", d];
        all.extend_from_slice(args);
        json_lines(&ok(&audit(&all)))
    };
    // The client's id finds the request (a refusal: one record) ...
    let by_client = show(&["--request-id", "client-3"]);
    assert_eq!(by_client.len(), 1, "{by_client:?}");
    assert_eq!(by_client[0]["request_id"], "req-3");
    // ... and a generation's completion, matched by the server's id.
    let by_client = show(&["--request-id", "client-2"]);
    assert_eq!(by_client.len(), 2, "{by_client:?}");
    assert_eq!(by_client[1]["type"], "completion");
    assert_eq!(show(&["--request-id", "req-2"]), by_client);

    let too_many = show(&["--status", "429"]);
    assert_eq!(too_many.len(), 2);
    assert!(too_many.iter().all(|r| r["status"] == 429));
    assert_eq!(show(&["--status", "4xx"]).len(), 3);
    let ok_records = show(&["--status", "2xx"]);
    let ok_requests = REQUESTS.iter().filter(|(_, s)| *s == 200).count();
    assert_eq!(
        ok_records.len(),
        2 * ok_requests,
        "request and completion each"
    );
    assert_eq!(show(&["--status", "500"]).len(), 2);

    let all = show(&[]);
    assert_eq!(show(&["--since", "2000-01-01"]).len(), all.len());
    assert!(show(&["--until", "2000-01-01"]).is_empty());
    assert!(show(&["--since", "2999-12-31"]).is_empty());

    for bad in [
        vec!["--event-type", "gpu-ready"],
        vec!["--status", "abc"],
        vec!["--since", "31/01/2026"],
    ] {
        let mut args = vec!["show", d];
        args.extend(bad.iter().copied());
        let out = audit(&args);
        assert_eq!(out.status.code(), Some(1), "{bad:?}");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(err.lines().count(), 1, "{err}");
        if bad[0] == "--event-type" {
            assert!(
                err.contains("known kinds: request, completion, started,")
                    && err.contains("gpu_ready"),
                "{err}"
            );
        }
    }
}

#[test]
fn a_closed_pipe_ends_show_and_export_quietly() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = log_dir(tmp.path());
    let d = dir.to_str().expect("utf8");
    for args in [
        vec!["show", d],
        vec!["export", d, "--format", "jsonl"],
        vec!["export", d, "--format", "csv"],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_inferno"))
            .arg("audit")
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        // The reader goes away before the command writes anything.
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("wait");
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.stderr.is_empty(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The CSV export as rows of column name to value.
fn csv_rows(dir: &Path) -> Vec<HashMap<String, String>> {
    let text = ok(&audit(&[
        "export",
        dir.to_str().expect("utf8"),
        "--format",
        "csv",
    ]));
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let header: Vec<String> = reader
        .headers()
        .expect("header")
        .iter()
        .map(str::to_owned)
        .collect();
    reader
        .records()
        .map(|r| {
            header
                .iter()
                .cloned()
                .zip(r.expect("row").iter().map(str::to_owned))
                .collect()
        })
        .collect()
}

#[test]
fn csv_carries_every_scalar_field_and_principals_on_completions() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = log_dir(tmp.path());
    let rows = csv_rows(&dir);
    let jsonl = ok(&audit(&[
        "export",
        dir.to_str().expect("utf8"),
        "--format",
        "jsonl",
    ]));
    assert_eq!(rows.len(), jsonl.lines().count());
    // Every scalar field of every record appears under its own name, with the same value.
    for (row, line) in rows.iter().zip(json_lines(&jsonl)) {
        for (key, value) in line.as_object().expect("object") {
            let expected = match value {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Number(n) => n.to_string(),
                serde_json::Value::Bool(b) => b.to_string(),
                _ => continue,
            };
            let column = match key.as_str() {
                "v" => continue,
                "type" | "event" => key.as_str(),
                other => other,
            };
            assert_eq!(
                row.get(column),
                Some(&expected),
                "column {column} of record {}",
                row["index"]
            );
        }
    }
    for row in rows.iter().filter(|r| r["type"] == "completion") {
        let i: usize = row["request_id"]["req-".len()..].parse().expect("id");
        assert_eq!(row["principal"], REQUESTS[i].0, "{row:?}");
        assert_eq!(row["client_request_id"], format!("client-{i}"));
        assert_eq!(row["completion_mode"], "hmac");
        assert_eq!(row["completion_hmac"].len(), 64);
    }
    let started = rows
        .iter()
        .find(|r| r["event"] == "started")
        .expect("start");
    assert_eq!(
        started["evidence_sha256"].len(),
        64,
        "evidence as its digest"
    );
    assert!(
        rows.iter().all(|r| r.values().all(|v| v.len() < 200)),
        "no blob in a cell"
    );
}

#[test]
fn receipt_checks_the_output_of_prove_offline() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = log_dir(tmp.path());
    let d = dir.to_str().expect("utf8");
    let started = json_lines(&ok(&audit(&["show", d, "--event-type", "started"])));
    let key = started[0]["checkpoint_key"]
        .as_str()
        .expect("key")
        .to_owned();
    let proof = tmp.path().join("proof.txt");
    std::fs::write(&proof, ok(&audit(&["prove", d, "--index", "5"]))).expect("write");
    let jsonl = ok(&audit(&["export", d, "--format", "jsonl"]));
    let record = tmp.path().join("record.json");
    std::fs::write(&record, jsonl.lines().nth(5).expect("record 5")).expect("write");
    let p = proof.to_str().expect("utf8");
    let r = record.to_str().expect("utf8");

    let out = ok(&audit(&["receipt", p, "--key", &key, "--record", r]));
    assert!(out.starts_with("proof verified: record 5 "), "{out}");
    assert!(out.contains("the record matches its leaf hash"), "{out}");

    // Another record, another key, a changed proof: each refused with one line.
    std::fs::write(&record, jsonl.lines().nth(6).expect("record 6")).expect("write");
    let other = tmp.path().join("other");
    write_log(&other);
    let other_key = json_lines(&ok(&audit(&[
        "show",
        other.to_str().expect("utf8"),
        "--event-type",
        "started",
    ])))[0]["checkpoint_key"]
        .as_str()
        .expect("key")
        .to_owned();
    let tampered = tmp.path().join("tampered.txt");
    let text = std::fs::read_to_string(&proof).expect("read");
    std::fs::write(&tampered, text.replacen("index 5", "index 4", 1)).expect("write");
    for args in [
        vec!["receipt", p, "--key", &key, "--record", r],
        vec!["receipt", p, "--key", &other_key],
        vec!["receipt", tampered.to_str().expect("utf8"), "--key", &key],
    ] {
        let out = audit(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stdout(&out));
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(err.starts_with("error: proof "), "{err}");
    }
}

/// Section 2 of a report (raw HTML or Chromium's DOM): (day, principal) to field values.
fn per_day_table(html: &str) -> BTreeMap<(String, String), BTreeMap<String, u64>> {
    let attr = |tag: &str, name: &str| -> String {
        let key = format!("{name}=\"");
        let start = tag.find(&key).expect("attribute") + key.len();
        tag[start..][..tag[start..].find('"').expect("quote")].to_owned()
    };
    let mut table = BTreeMap::new();
    for chunk in html.split("<tr data-day=").skip(1) {
        let row = &chunk[..chunk.find("</tr>").expect("row end")];
        let tag = format!("data-day={}", &row[..row.find('>').expect("tag end")]);
        let mut fields = BTreeMap::new();
        for cell in row.split("data-field=\"").skip(1) {
            let name = &cell[..cell.find('"').expect("quote")];
            let value = &cell[cell.find('>').expect(">") + 1..cell.find('<').expect("<")];
            fields.insert(name.to_owned(), value.trim().parse().expect("number"));
        }
        table.insert(
            (attr(&tag, "data-day"), attr(&tag, "data-principal")),
            fields,
        );
    }
    table
}

/// The same table, recomputed from `audit export --format csv` as the report's section 6 says.
fn per_day_from_export(
    dir: &Path,
    principal: Option<&str>,
) -> BTreeMap<(String, String), BTreeMap<String, u64>> {
    let rows = csv_rows(dir);
    let completions: HashMap<&str, &HashMap<String, String>> = rows
        .iter()
        .filter(|r| r["type"] == "completion")
        .map(|r| (r["request_id"].as_str(), r))
        .collect();
    let mut table: BTreeMap<(String, String), BTreeMap<String, u64>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r["type"] == "request") {
        if principal.is_some_and(|p| r["principal"] != p) {
            continue;
        }
        let done = completions.get(r["request_id"].as_str());
        let status = if r["status"].is_empty() {
            done.map(|c| c["status"].clone()).unwrap_or_default()
        } else {
            r["status"].clone()
        };
        let class = match status.chars().next() {
            Some('2') => "s2xx",
            Some('4') => "s4xx",
            Some('5') => "s5xx",
            _ => "other",
        };
        let key = (r["time"][..10].to_owned(), r["principal"].clone());
        let entry = table.entry(key).or_insert_with(|| {
            [
                "requests",
                "s2xx",
                "s4xx",
                "s5xx",
                "other",
                "prompt_tokens",
                "completion_tokens",
            ]
            .iter()
            .map(|f| ((*f).to_owned(), 0))
            .collect()
        });
        *entry.get_mut("requests").expect("field") += 1;
        *entry.get_mut(class).expect("field") += 1;
        if let Some(c) = done {
            for f in ["prompt_tokens", "completion_tokens"] {
                *entry.get_mut(f).expect("field") += c[f].parse::<u64>().expect("tokens");
            }
        }
    }
    table
}

/// `html` with the entities the template's escaping writes turned back into characters.
fn unescape(html: &str) -> String {
    html.replace("&#x2f;", "/")
        .replace("&#x27;", "'")
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// Writes the report and returns it, unescaped (see [`unescape`]), after checking the raw
/// file holds nothing a browser could fetch.
fn report(dir: &Path, out: &Path, extra: &[&str]) -> String {
    let mut args = vec![
        "report",
        dir.to_str().expect("utf8"),
        "--out",
        out.to_str().expect("utf8"),
    ];
    args.extend_from_slice(extra);
    let printed = ok(&audit(&args));
    assert!(printed.starts_with("INTACT: "), "{printed}");
    let raw = std::fs::read_to_string(out).expect("report");
    assert_eq!(fetchable(&raw), Vec::<String>::new());
    unescape(&raw)
}

/// Whatever in `html` could make a browser fetch something.
fn fetchable(html: &str) -> Vec<String> {
    let lower = html.to_ascii_lowercase();
    let mut found = Vec::new();
    for needle in [
        "src=", "href=", "<script", "<link", "url(", "@import", "<iframe", "<object", "<embed",
    ] {
        if lower.contains(needle) {
            found.push(needle.to_owned());
        }
    }
    // The SVG namespace is a name, never fetched; any other URL is suspect. (A scheme-relative
    // `//host` URL needs one of the attributes above; base64 digests may hold `//`.)
    let without_ns = lower.replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
    for scheme in ["http:", "https:", "ftp:", "file:", "data:"] {
        if without_ns.contains(scheme) {
            found.push(scheme.to_owned());
        }
    }
    found
}

#[test]
fn the_report_is_self_contained_and_its_numbers_are_the_exports() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = log_dir(tmp.path());
    let html = report(&dir, &tmp.path().join("report.html"), &[]);
    assert!(
        html.contains("<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'sha256-"),
        "a strict CSP"
    );
    for section in [
        "id=\"verdict\"",
        "id=\"requests\"",
        "id=\"refusals\"",
        "id=\"events\"",
        "id=\"checkpoints\"",
        "id=\"reverify\"",
    ] {
        assert!(html.contains(section), "{section}");
    }
    assert!(html.contains("data-verdict=\"INTACT\""));
    assert!(html.contains("<svg id=\"chart-per-day\""));
    assert!(html.contains(">SIMULATED</td>"), "the run's attestation");
    assert!(html.contains("data-event=\"key_release\""));
    assert!(html.contains(&format!("inferno audit verify {}", dir.display())));
    // The files verified, with their digests.
    let seg = std::fs::read(dir.join("0000000000000000.seg")).expect("segment");
    use sha2::Digest as _;
    assert!(html.contains(&hex::encode(sha2::Sha256::digest(&seg))));

    let table = per_day_table(&html);
    assert_eq!(table, per_day_from_export(&dir, None));
    assert_eq!(table.len(), 3, "three principals on one day: {table:?}");
    // Refusals by reason: 429 twice, 401 and 500 once.
    for (status, count) in [(429, 2), (401, 1), (500, 1)] {
        let row = format!("<tr data-status=\"{status}\" data-endpoint=\"/v1/chat/completions\">");
        let at = html.find(&row).unwrap_or_else(|| panic!("{row}"));
        let rest = &html[at..];
        let cell = &rest[rest.find("data-field=\"count\">").expect("count") + 19..];
        assert_eq!(&cell[..cell.find('<').expect("<")], count.to_string());
    }

    // Narrowed to one principal, or to nothing.
    let bob = report(&dir, &tmp.path().join("bob.html"), &["--principal", "bob"]);
    assert_eq!(per_day_table(&bob), per_day_from_export(&dir, Some("bob")));
    let none = report(
        &dir,
        &tmp.path().join("none.html"),
        &["--since", "2999-01-01"],
    );
    assert!(per_day_table(&none).is_empty());
}

/// Runs headless Chromium on `page` with a fresh profile and `args`; returns (stdout, the URLs
/// the page itself requested, from the net log: background requests of the browser carry no
/// origin and are left out).
fn chromium(tmp: &Path, page: &Path, args: &[&str]) -> (String, Vec<String>) {
    let profile = tempfile::tempdir_in(tmp).expect("profile");
    let net_log = profile.path().join("net-log.json");
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--log-net-log={}", net_log.display()))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("chromium runs (apt-get install chromium)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&net_log).expect("net log")).expect("json");
    let start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"].clone();
    let requested = log["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["type"] == start_job && e["params"]["initiator"] != "not an origin")
        .filter_map(|e| e["params"]["url"].as_str().map(str::to_owned))
        .collect();
    (stdout(&out), requested)
}

#[test]
#[ignore = "needs Debian's chromium; scripts/test.sh runs it (CI installs chromium)"]
fn the_report_renders_in_headless_chromium_and_requests_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = log_dir(tmp.path());
    let page = tmp.path().join("report.html");
    report(&dir, &page, &[]);
    let html = std::fs::read_to_string(&page).expect("report");

    let (dom, requested) = chromium(tmp.path(), &page, &["--dump-dom"]);
    assert_eq!(requested, Vec::<String>::new(), "the page requested URLs");
    assert!(dom.contains("data-verdict=\"INTACT\""), "{dom}");
    let table = per_day_table(&dom);
    assert_eq!(table, per_day_from_export(&dir, None));
    assert!(!table.is_empty());

    // A screenshot, kept where CI can pick it up when SCREENSHOT_DIR is set.
    let shot_dir =
        std::env::var_os("SCREENSHOT_DIR").map_or_else(|| tmp.path().to_owned(), PathBuf::from);
    std::fs::create_dir_all(&shot_dir).expect("screenshot dir");
    let shot = shot_dir.join("audit-report.png");
    chromium(
        tmp.path(),
        &page,
        &[
            "--window-size=1200,1800",
            &format!("--screenshot={}", shot.display()),
        ],
    );
    let png = std::fs::read(&shot).expect("screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );

    // The detector sees a fetch, and the report's policy blocks one.
    let inject = |html: &str, name: &str| {
        let p = tmp.path().join(name);
        std::fs::write(
            &p,
            html.replace("</body>", "<img src=\"http://127.0.0.1:9/x.png\"></body>"),
        )
        .expect("write");
        p
    };
    let without_csp = html.replace("http-equiv=\"Content-Security-Policy\"", "name=\"x\"");
    let (_, seen) = chromium(
        tmp.path(),
        &inject(&without_csp, "open.html"),
        &["--dump-dom"],
    );
    assert_eq!(seen, vec!["http://127.0.0.1:9/x.png".to_owned()]);
    let (_, blocked) = chromium(tmp.path(), &inject(&html, "blocked.html"), &["--dump-dom"]);
    assert_eq!(blocked, Vec::<String>::new());
}

#[test]
fn the_evidence_pack_verifies_in_a_fresh_directory_with_only_the_binary() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = log_dir(tmp.path());
    let policy = tmp.path().join("server-policy.toml");
    std::fs::write(&policy, "name = \"test\"\n").expect("write");
    let pack = tmp.path().join("pack.tar");
    let out = ok(&audit(&[
        "evidence-pack",
        dir.to_str().expect("utf8"),
        "--out",
        pack.to_str().expect("utf8"),
        "--server-policy",
        policy.to_str().expect("utf8"),
    ]));
    assert!(out.starts_with("INTACT: "), "{out}");

    let fresh = tempfile::tempdir().expect("fresh");
    tar::Archive::new(std::fs::File::open(&pack).expect("pack"))
        .unpack(fresh.path())
        .expect("unpacks");
    let root = fresh.path().join("inferno-evidence");
    let bin = root.join("inferno");
    std::fs::copy(env!("CARGO_BIN_EXE_inferno"), &bin).expect("copy the binary");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README");
    assert!(readme.contains("Nobody signs this pack"), "{readme}");
    assert!(readme.contains("./inferno audit verify log"), "{readme}");
    for name in [
        "verify.json",
        "verify.txt",
        "report.html",
        "log/checkpoints.log",
        "policies/server/server-policy.toml",
    ] {
        assert!(root.join(name).is_file(), "{name}");
    }

    // The README's commands, in the pack's directory, with nothing else.
    let run = |program: &Path, args: &[&str]| {
        Command::new(program)
            .args(args)
            .current_dir(&root)
            .env_clear()
            .output()
            .expect("runs")
    };
    let sums = run(Path::new("/usr/bin/sha256sum"), &["-c", "MANIFEST.sha256"]);
    assert!(sums.status.success(), "{}", stdout(&sums));
    let verified = ok(&run(&bin, &["audit", "verify", "log"]));
    let transcript = std::fs::read_to_string(root.join("verify.txt")).expect("transcript");
    assert_eq!(
        verified.lines().next(),
        transcript.lines().next(),
        "the same verdict as packed"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(&run(&bin, &["audit", "verify", "log", "--json"]))).expect("json");
    let packed: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("verify.json")).expect("json"))
            .expect("json");
    for field in [
        "verdict",
        "records",
        "checkpoints",
        "last_checkpoint",
        "runs",
        "keys",
    ] {
        assert_eq!(json[field], packed[field], "{field}");
    }

    // A changed segment in the pack is found.
    let seg = root.join("log/0000000000000000.seg");
    let mut bytes = std::fs::read(&seg).expect("segment");
    let at = bytes.len() / 2;
    bytes[at] ^= 1;
    std::fs::write(&seg, bytes).expect("write");
    assert_eq!(
        run(&bin, &["audit", "verify", "log"]).status.code(),
        Some(1)
    );
}

/// A witness key file and its verifier key.
fn witness(tmp: &Path, name: &str) -> (PathBuf, String) {
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).expect("key");
    let key = tmp.join(format!("{}.der", name.replace('/', "_")));
    std::fs::write(&key, pkcs8.as_ref()).expect("write key");
    let k = key.to_str().expect("utf8");
    let vkey = ok(&audit(&["witness", "vkey", "--key", k, "--name", name]));
    (key, vkey.trim().to_owned())
}

#[test]
fn a_witnessed_log_reports_its_cosignature_and_packs_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = log_dir(tmp.path());
    let d = dir.to_str().expect("utf8");
    let (key, vkey) = witness(tmp.path(), "witness.test/w");
    let checkpoint = tmp.path().join("c1.txt");
    std::fs::write(&checkpoint, ok(&audit(&["checkpoint", d]))).expect("write");
    let log_key =
        json_lines(&ok(&audit(&["show", d, "--event-type", "started"])))[0]["checkpoint_key"]
            .as_str()
            .expect("key")
            .to_owned();
    let cosigned = tmp.path().join("c1.cosigned");
    let c = cosigned.to_str().expect("utf8");
    ok(&audit(&[
        "witness",
        "cosign",
        "--key",
        key.to_str().expect("utf8"),
        "--name",
        "witness.test/w",
        "--state",
        tmp.path().join("state").to_str().expect("utf8"),
        "--log-key",
        &log_key,
        "--checkpoint",
        checkpoint.to_str().expect("utf8"),
        "--init",
        "--out",
        c,
    ]));

    let witnessed = ["--trusted-checkpoint", c, "--witness-key", &vkey];
    let mut args = vec!["verify", d, "--json"];
    args.extend_from_slice(&witnessed);
    let json: serde_json::Value = serde_json::from_str(&ok(&audit(&args))).expect("json");
    let w = &json["witness"];
    assert_eq!(w["contained"], true, "{w}");
    assert_eq!(w["size"], json["records"]["total"]);
    assert_eq!(w["cosignatures"][0]["name"], "witness.test/w");
    assert!(w["cosignatures"][0]["time"].as_str().is_some(), "{w}");
    assert_eq!(w["required"][0]["verified"], true);
    let text = ok(&audit(&[
        "verify",
        d,
        "--trusted-checkpoint",
        c,
        "--witness-key",
        &vkey,
    ]));
    assert!(text.contains("  cosigned by witness.test/w ("), "{text}");
    assert!(
        text.contains("  required witness witness.test/w: verified"),
        "{text}"
    );
    // Another witness's key: the verdict fails.
    let (_, other) = witness(tmp.path(), "witness.test/other");
    let out = audit(&[
        "verify",
        d,
        "--trusted-checkpoint",
        c,
        "--witness-key",
        &other,
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));

    // The pack carries the cosigned checkpoint; its README's command verifies it.
    let pack = tmp.path().join("pack.tar");
    let mut args = vec!["evidence-pack", d, "--out", pack.to_str().expect("utf8")];
    args.extend_from_slice(&witnessed);
    ok(&audit(&args));
    let fresh = tempfile::tempdir().expect("fresh");
    tar::Archive::new(std::fs::File::open(&pack).expect("pack"))
        .unpack(fresh.path())
        .expect("unpacks");
    let root = fresh.path().join("inferno-evidence");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README");
    let command = format!(
        "./inferno audit verify log --trusted-checkpoint witness/c1.cosigned --witness-key '{vkey}'"
    );
    assert!(readme.contains(&command), "{readme}");
    let report = std::fs::read_to_string(root.join("report.html")).expect("report");
    assert!(unescape(&report).contains("<td>witness.test/w</td>"));
    let bin = root.join("inferno");
    std::fs::copy(env!("CARGO_BIN_EXE_inferno"), &bin).expect("copy the binary");
    let out = Command::new(&bin)
        .args([
            "audit",
            "verify",
            "log",
            "--trusted-checkpoint",
            "witness/c1.cosigned",
        ])
        .args(["--witness-key", &vkey])
        .current_dir(&root)
        .env_clear()
        .output()
        .expect("runs");
    let text = ok(&out);
    assert!(
        text.contains("required witness witness.test/w: verified"),
        "{text}"
    );
}
