//! Property-based fuzz targets for what an auditor's machine reads from an untrusted disk or
//! network (issue 14): segment files and their checkpoints, and signed notes, checkpoints and
//! verifier keys. They run a bounded number of cases in `cargo test`; `scripts/fuzz.sh` runs them
//! for a fixed time with many more. A failure is kept by proptest in
//! `fuzz_audit_input.proptest-regressions` and replayed first from then on.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use inferno_audit::note::{Checkpoint, NoteSigner, SignedNote, VerifierKey};
use inferno_audit::{
    AuditConfig, AuditLog, CHECKPOINTS_FILE, CompletionRecord, RecordBody, RequestRecord,
    SealedContent, StartInfo, StdFileOps, VerifyOptions, read_records, verify,
};
use proptest::prelude::*;

fn config(dir: &Path) -> AuditConfig {
    AuditConfig {
        dir: dir.to_path_buf(),
        checkpoint_every_records: 0,
        checkpoint_every_seconds: 0,
        segment_max_bytes: 1024,
        ..AuditConfig::default()
    }
}

fn request(id: &str) -> RecordBody {
    RecordBody::Request(RequestRecord {
        request_id: id.into(),
        client_request_id: Some(format!("client \"{id}\"")),
        principal: "key-1".into(),
        endpoint: "/v1/completions".into(),
        model_digest: "sha256:00".into(),
        stream: false,
        prompt: SealedContent::None,
        status: None,
        constraint: None,
    })
}

fn completion(id: &str) -> RecordBody {
    RecordBody::Completion(CompletionRecord {
        request_id: id.into(),
        prompt_tokens: 3,
        completion_tokens: 5,
        finish_reason: Some("stop".into()),
        status: 200,
        latency_ms: 12,
        completion: SealedContent::None,
    })
}

/// The template log's directory and its files (name, bytes), sorted by name.
type Template = (tempfile::TempDir, Vec<(String, Vec<u8>)>);

/// A small, cleanly closed log of several segments, written once; each case copies it.
fn template() -> &'static Template {
    static TEMPLATE: OnceLock<Template> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let tmp = tempfile::tempdir().expect("tempdir");
        let cfg = config(&tmp.path().join("log"));
        let signer = AuditLog::generate_signer(&cfg).expect("signer");
        let log = AuditLog::open(
            &cfg,
            Arc::new(StdFileOps),
            signer,
            StartInfo {
                software_version: "fuzz".into(),
                evidence: Vec::new(),
            },
        )
        .expect("log opens");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            for i in 0..12 {
                let id = format!("r{i}");
                log.append(request(&id)).await.expect("append");
                log.append(completion(&id)).await.expect("append");
            }
            log.shutdown("fuzz template").await.expect("shutdown");
        });
        let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&cfg.dir)
            .expect("log dir")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.is_file())
            .map(|p| {
                let name = p.file_name().expect("name").to_string_lossy().into_owned();
                (name, std::fs::read(&p).expect("read"))
            })
            .collect();
        files.sort();
        (tmp, files)
    })
}

/// A fresh copy of the template log with `mutate` applied to file number `chosen` (none without).
fn mutated_copy(
    chosen: Option<usize>,
    mutate: impl FnOnce(&mut Vec<u8>),
) -> (tempfile::TempDir, PathBuf) {
    let (_, files) = template();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("log");
    std::fs::create_dir(&dir).expect("dir");
    let mut mutate = Some(mutate);
    for (i, (name, bytes)) in files.iter().enumerate() {
        let mut bytes = bytes.clone();
        if chosen == Some(i)
            && let Some(mutate) = mutate.take()
        {
            mutate(&mut bytes);
        }
        std::fs::write(dir.join(name), bytes).expect("write");
    }
    (tmp, dir)
}

#[test]
fn the_unmodified_template_verifies() {
    let (_tmp, dir) = mutated_copy(None, |_| {});
    let report = verify(&dir, &VerifyOptions::default());
    assert!(report.violation.is_none(), "{:?}", report.violation);
    assert_eq!(
        report.size,
        1 + 24 + 1,
        "start, 12 requests and completions, stop"
    );
    assert!(report.incomplete.is_empty());
}

proptest! {
    /// A flipped byte anywhere in a segment or the checkpoints file is reported as a violation,
    /// and neither verification nor reading panics.
    #[test]
    fn flipped_bytes_are_detected_and_never_crash(
        pick in any::<prop::sample::Index>(),
        at in any::<prop::sample::Index>(),
        xor in 1u8..=255,
    ) {
        let (_, files) = template();
        let signed: Vec<usize> = files
            .iter()
            .enumerate()
            .filter(|(_, (name, bytes))| {
                !bytes.is_empty() && (name.ends_with(".seg") || name == CHECKPOINTS_FILE)
            })
            .map(|(i, _)| i)
            .collect();
        let file = signed[pick.index(signed.len())];
        let (_tmp, dir) = mutated_copy(Some(file), |bytes| {
            let i = at.index(bytes.len());
            bytes[i] ^= xor;
        });
        let report = verify(&dir, &VerifyOptions::default());
        let _ = read_records(&dir);
        prop_assert!(
            report.violation.is_some(),
            "flip at {} of {} went unnoticed: {report:?}",
            at.index(files[file].1.len()),
            files[file].0
        );
    }

    /// Truncated, extended or replaced files never crash the verifier or the reader.
    #[test]
    fn cut_or_grown_files_never_crash_verify_or_read(
        pick in any::<prop::sample::Index>(),
        keep in any::<prop::sample::Index>(),
        extra in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let (_tmp, dir) = mutated_copy(Some(pick.index(template().1.len())), |bytes| {
            let cut = keep.index(bytes.len() + 1);
            bytes.truncate(cut);
            bytes.extend_from_slice(&extra);
        });
        let _ = verify(&dir, &VerifyOptions::default());
        let _ = read_records(&dir);
    }

    /// Arbitrary text as a signed note, a checkpoint body or a verifier key parses or is refused.
    #[test]
    fn arbitrary_notes_checkpoints_and_keys_never_crash(text in "(?s).{0,400}") {
        let _ = SignedNote::parse(&text).map(|n| n.checkpoint());
        let _ = Checkpoint::parse_body(&text);
        let _ = VerifierKey::parse(&text);
    }

    /// Any change to a signed checkpoint's bytes either fails to parse or fails to verify.
    #[test]
    fn a_changed_signed_checkpoint_never_verifies(
        at in any::<prop::sample::Index>(),
        replacement in any::<char>(),
    ) {
        static SIGNED: OnceLock<(String, VerifierKey)> = OnceLock::new();
        let (signed, verifier) = SIGNED.get_or_init(|| {
            let signer = NoteSigner::generate("fuzz.example/log").expect("signer");
            let note = signer.sign_checkpoint(&Checkpoint {
                origin: "fuzz.example/log".into(),
                size: 27,
                root: [7; 32],
            });
            (note.render(), signer.verifier())
        });
        let mut chars: Vec<char> = signed.chars().collect();
        let i = at.index(chars.len());
        if chars[i] == replacement {
            return Ok(());
        }
        chars[i] = replacement;
        let changed: String = chars.into_iter().collect();
        if let Ok(note) = SignedNote::parse(&changed) {
            // A change in the signature line's key name or hash is a missing signature; one in
            // the text or the signature bytes a bad one. Either way: refused.
            prop_assert!(verifier.verify(&note).is_err(), "{changed:?} verified");
        }
    }
}
