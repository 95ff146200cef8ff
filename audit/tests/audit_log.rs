//! The audit log writer, recovery, fault injection, corruption detection and the witness.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use inferno_audit::ConsistencyProof;
use inferno_audit::SealedContent;
use inferno_audit::merkle::TreeView;
use inferno_audit::newest_record_time;
use inferno_audit::note::{ALG_COSIGNATURE_V1, NoteSigner, SignedNote, VerifierKey};
use inferno_audit::{AppendFile, FileOps, StdFileOps};
use inferno_audit::{
    AuditConfig, AuditError, AuditLog, CompletionRecord, RecordBody, RequestRecord, SecurityEvent,
    StartInfo,
};
use inferno_audit::{VerifyOptions, load_tree, verify};
use inferno_audit::{WitnessError, add_checkpoint};

fn config(dir: &Path) -> AuditConfig {
    AuditConfig {
        dir: dir.to_path_buf(),
        checkpoint_every_records: 0,
        checkpoint_every_seconds: 0,
        segment_max_bytes: 2048,
        ..AuditConfig::default()
    }
}

fn open_with(cfg: &AuditConfig, ops: Arc<dyn FileOps>) -> Result<AuditLog, AuditError> {
    let signer = AuditLog::generate_signer(cfg)?;
    AuditLog::open(
        cfg,
        ops,
        signer,
        StartInfo {
            software_version: "test".into(),
            evidence: Vec::new(),
        },
    )
}

fn open(cfg: &AuditConfig) -> AuditLog {
    open_with(cfg, Arc::new(StdFileOps)).expect("log opens")
}

fn request(id: &str) -> RecordBody {
    RecordBody::Request(RequestRecord {
        request_id: id.into(),
        client_request_id: None,
        principal: "key-1".into(),
        endpoint: "/v1/chat/completions".into(),
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

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Writes `n` requests with completions concurrently and shuts down cleanly.
fn write_log(cfg: &AuditConfig, n: usize) {
    let log = open(cfg);
    runtime().block_on(async {
        let futures: Vec<_> = (0..n)
            .flat_map(|i| {
                let id = format!("req-{i}");
                [log.append(request(&id)), log.append(completion(&id))]
            })
            .collect();
        for r in futures_util::future::join_all(futures).await {
            r.expect("append");
        }
        log.shutdown("test done").await.expect("shutdown");
    });
}

#[test]
fn appends_are_durable_and_the_log_verifies_across_restarts() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = config(tmp.path());
    write_log(&cfg, 40);
    let report = verify(tmp.path(), &VerifyOptions::default());
    assert!(report.intact(), "{}", report.verdict());
    // start + 80 records + stop
    assert_eq!(report.size, 82);
    assert_eq!(report.checkpointed_size, 82);
    assert!(report.incomplete.is_empty());
    let segments = std::fs::read_dir(tmp.path())
        .expect("dir")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "seg"))
        })
        .count();
    assert!(
        segments > 1,
        "rotation by size produced {segments} segment(s)"
    );

    // A restart uses a new key and records the change.
    write_log(&cfg, 2);
    let report = verify(tmp.path(), &VerifyOptions::default());
    assert!(report.intact(), "{}", report.verdict());
    assert_eq!(report.starts.len(), 2);
    assert_ne!(
        report.starts[0].checkpoint_key,
        report.starts[1].checkpoint_key
    );
    let (prefix, leaves) = load_tree(tmp.path()).expect("tree");
    assert_eq!(TreeView::new(&prefix, &leaves).size(), report.size);
}

#[test]
fn requests_without_completion_are_listed_as_incomplete() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = config(tmp.path());
    let log = open(&cfg);
    runtime().block_on(async {
        log.append(request("done")).await.expect("append");
        log.append(completion("done")).await.expect("append");
        log.append(request("lost")).await.expect("append");
        log.shutdown("test").await.expect("shutdown");
    });
    let report = verify(tmp.path(), &VerifyOptions::default());
    assert!(report.intact(), "{}", report.verdict());
    assert_eq!(report.incomplete, vec!["lost".to_owned()]);
}

fn last_segment(dir: &Path) -> PathBuf {
    let mut segs: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    segs.sort();
    segs.pop().expect("a segment")
}

fn append_bytes(path: &Path, bytes: &[u8]) {
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .expect("open");
    f.write_all(bytes).expect("write");
}

#[test]
fn torn_tail_is_truncated_and_recorded_at_open() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = config(tmp.path());
    write_log(&cfg, 3);
    let seg = last_segment(tmp.path());
    let before = std::fs::metadata(&seg).expect("meta").len();
    // A frame header promising 100 bytes, followed by only 10: a write cut short by a crash.
    let mut torn = 100u32.to_le_bytes().to_vec();
    torn.extend_from_slice(&[0xAB; 14]);
    append_bytes(&seg, &torn);
    let report = verify(tmp.path(), &VerifyOptions::default());
    let verdict = report.verdict();
    assert!(verdict.contains("torn tail"), "{verdict}");
    assert!(verdict.contains(&format!("offset {before}")), "{verdict}");

    let log = open(&cfg);
    runtime().block_on(async { log.shutdown("test").await.expect("shutdown") });
    let report = verify(tmp.path(), &VerifyOptions::default());
    assert!(report.intact(), "{}", report.verdict());
    let all = all_segments_text(tmp.path());
    assert!(
        all.contains(r#""event":"recovery""#) && all.contains("torn tail"),
        "no recovery event"
    );
}

#[test]
fn damage_inside_the_checkpointed_range_is_a_hard_fault() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = config(tmp.path());
    write_log(&cfg, 3);
    let seg = last_segment(tmp.path());
    let len = std::fs::metadata(&seg).expect("meta").len();
    // Cutting the last (checkpointed) record looks like a torn tail but is below the checkpoint.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .and_then(|f| f.set_len(len - 5))
        .expect("truncate");
    match open_with(&cfg, Arc::new(StdFileOps)) {
        Err(AuditError::Corrupt { location, .. }) => {
            assert!(location.contains(".seg offset"), "{location}")
        }
        other => panic!("expected a hard fault, got {other:?}"),
    }
    assert!(!verify(tmp.path(), &VerifyOptions::default()).intact());
}

#[test]
fn corrupting_any_byte_is_detected_and_located() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = AuditConfig {
        segment_max_bytes: 1 << 20,
        ..config(tmp.path())
    };
    write_log(&cfg, 2);
    let mut files: Vec<PathBuf> = std::fs::read_dir(tmp.path())
        .expect("dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        // The writer's lock file holds no log data.
        .filter(|p| !p.ends_with(inferno_audit::LOCK_FILE))
        .collect();
    files.sort();
    assert_eq!(
        files.len(),
        2,
        "one segment and the checkpoints file: {files:?}"
    );
    let mut checked = 0;
    for file in &files {
        let original = std::fs::read(file).expect("read");
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .expect("name")
            .to_owned();
        for pos in 0..original.len() {
            let mut damaged = original.clone();
            damaged[pos] ^= 0xFF;
            std::fs::write(file, &damaged).expect("write");
            let report = verify(tmp.path(), &VerifyOptions::default());
            let v = report
                .violation
                .unwrap_or_else(|| panic!("flipping byte {pos} of {name} went undetected"));
            let loc = v
                .location
                .unwrap_or_else(|| panic!("no location for byte {pos} of {name}"));
            assert_eq!(
                loc.file.file_name().and_then(|n| n.to_str()),
                Some(name.as_str())
            );
            assert!(
                loc.offset <= pos as u64,
                "byte {pos} of {name} reported at {}",
                loc.offset
            );
            checked += 1;
        }
        std::fs::write(file, &original).expect("restore");
    }
    assert!(checked > 500, "only {checked} bytes checked");
    assert!(verify(tmp.path(), &VerifyOptions::default()).intact());
}

/// File operations that fail once a byte budget is spent (disk full) or on fsync (EIO).
struct Faulty {
    budget: Arc<AtomicU64>,
    fail_sync: Arc<AtomicBool>,
}

struct FaultyFile {
    inner: Box<dyn AppendFile>,
    budget: Arc<AtomicU64>,
    fail_sync: Arc<AtomicBool>,
}

impl AppendFile for FaultyFile {
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        let left = self.budget.load(Ordering::SeqCst);
        if (buf.len() as u64) > left {
            // Write what fits, as a full disk does, then fail.
            self.inner.write_all(&buf[..left as usize])?;
            self.budget.store(0, Ordering::SeqCst);
            return Err(std::io::Error::from_raw_os_error(28)); // ENOSPC
        }
        self.budget.fetch_sub(buf.len() as u64, Ordering::SeqCst);
        self.inner.write_all(buf)
    }

    fn sync(&mut self) -> std::io::Result<()> {
        if self.fail_sync.load(Ordering::SeqCst) {
            return Err(std::io::Error::from_raw_os_error(5)); // EIO
        }
        self.inner.sync()
    }
}

impl WrapFile for Faulty {
    fn wrap(&self, _path: &Path, inner: Box<dyn AppendFile>) -> Box<dyn AppendFile> {
        Box::new(FaultyFile {
            inner,
            budget: Arc::clone(&self.budget),
            fail_sync: Arc::clone(&self.fail_sync),
        })
    }
}

/// Wraps each file that [`WrappedOps`] opens.
trait WrapFile: Send + Sync {
    fn wrap(&self, path: &Path, inner: Box<dyn AppendFile>) -> Box<dyn AppendFile>;
}

/// The real file system, with every opened file wrapped by `W`.
struct WrappedOps<W>(W);

impl<W: WrapFile> FileOps for WrappedOps<W> {
    fn create_new(&self, path: &Path) -> std::io::Result<Box<dyn AppendFile>> {
        Ok(self.0.wrap(path, StdFileOps.create_new(path)?))
    }
    fn open_append(&self, path: &Path) -> std::io::Result<Box<dyn AppendFile>> {
        Ok(self.0.wrap(path, StdFileOps.open_append(path)?))
    }
    fn truncate(&self, path: &Path, len: u64) -> std::io::Result<()> {
        StdFileOps.truncate(path, len)
    }
    fn remove(&self, path: &Path) -> std::io::Result<()> {
        StdFileOps.remove(path)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        StdFileOps.sync_dir(dir)
    }
}

fn fault_run(budget: u64, fail_sync_after_open: bool) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = config(tmp.path());
    let faulty = Faulty {
        budget: Arc::new(AtomicU64::new(u64::MAX)),
        fail_sync: Arc::new(AtomicBool::new(false)),
    };
    let (budget_handle, sync_handle) = (Arc::clone(&faulty.budget), Arc::clone(&faulty.fail_sync));
    let log = open_with(&cfg, Arc::new(WrappedOps(faulty))).expect("opens");
    budget_handle.store(budget, Ordering::SeqCst);
    sync_handle.store(fail_sync_after_open, Ordering::SeqCst);
    let rt = runtime();
    let mut acknowledged = Vec::new();
    let mut first_error = None;
    for i in 0..50 {
        let id = format!("r{i}");
        match rt.block_on(log.append(request(&id))) {
            Ok(_) => acknowledged.push(id),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    let err = first_error.expect("the fault surfaced");
    assert!(matches!(err, AuditError::Failed(_)), "{err}");
    assert!(log.failure().is_some(), "log is in the failed state");
    // Every later append fails too (fail closed), even once the disk has room again.
    budget_handle.store(u64::MAX, Ordering::SeqCst);
    sync_handle.store(false, Ordering::SeqCst);
    assert!(matches!(
        rt.block_on(log.append(request("late"))),
        Err(AuditError::Failed(_))
    ));
    drop(log);
    // After a restart on a healthy disk, the log recovers and every acknowledged record is there.
    let log = open(&cfg);
    rt.block_on(async { log.shutdown("test").await.expect("shutdown") });
    let report = verify(tmp.path(), &VerifyOptions::default());
    assert!(report.intact(), "{}", report.verdict());
    for id in &acknowledged {
        assert!(
            report.incomplete.contains(id),
            "acknowledged request {id} lost"
        );
    }
}

#[test]
fn disk_full_fails_closed_and_loses_no_acknowledged_record() {
    fault_run(700, false);
}

#[test]
fn fsync_error_fails_closed() {
    fault_run(u64::MAX, true);
}

fn witness_signer() -> NoteSigner {
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).expect("key");
    NoteSigner::from_pkcs8("witness.test/w1", ALG_COSIGNATURE_V1, pkcs8.as_ref()).expect("signer")
}

fn latest(dir: &Path) -> (SignedNote, VerifierKey) {
    let report = verify(dir, &VerifyOptions::default());
    let key =
        VerifierKey::parse(&report.starts.last().expect("start").checkpoint_key).expect("key");
    let text = inferno_audit::stored_checkpoints(dir)
        .expect("checkpoints")
        .pop()
        .expect("one");
    (SignedNote::parse(&text).expect("note"), key)
}

fn proof(dir: &Path, old: u64, new: u64) -> ConsistencyProof {
    let (prefix, leaves) = load_tree(dir).expect("tree");
    let hashes = TreeView::new(&prefix, &leaves)
        .consistency_proof(old, new)
        .expect("proof");
    ConsistencyProof { old, new, hashes }
}

#[test]
fn witness_cosigns_extensions_and_refuses_rollback_and_fork() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let state = tmp.path().join("witness.state");
    let log_dir = tmp.path().join("log");
    let cfg = config(&log_dir);
    let w = witness_signer();
    write_log(&cfg, 2);
    let (first, key1) = latest(&log_dir);
    let size1 = first.checkpoint().expect("cp").size;
    // No state: refused unless first use is explicitly trusted.
    assert!(matches!(
        add_checkpoint(&state, &w, &first, &key1, None, false, 1),
        Err(WitnessError::NoState)
    ));
    let cosigned = add_checkpoint(&state, &w, &first, &key1, None, true, 1).expect("init");
    assert_eq!(w.verifier().verify(&cosigned).expect("cosig"), Some(1));

    // A rolled-back copy of the log is kept aside, then the log grows.
    let rollback_dir = tmp.path().join("rollback");
    copy_dir(&log_dir, &rollback_dir);
    write_log(&cfg, 2);
    let (second, key2) = latest(&log_dir);
    let size2 = second.checkpoint().expect("cp").size;
    assert!(size2 > size1);
    // Without a proof: refused. With the proof: cosigned.
    assert!(add_checkpoint(&state, &w, &second, &key2, None, false, 2).is_err());
    let p = proof(&log_dir, size1, size2);
    add_checkpoint(&state, &w, &second, &key2, Some(&p), false, 2).expect("extension is cosigned");

    // Rollback: the older checkpoint is refused.
    let (old, old_key) = latest(&rollback_dir);
    assert!(matches!(
        add_checkpoint(&state, &w, &old, &old_key, None, false, 3),
        Err(WitnessError::Rollback { .. })
    ));

    // Fork: the rolled-back copy grows differently; its consistency proof from the witnessed
    // size does not verify.
    let fork_cfg = config(&rollback_dir);
    write_log(&fork_cfg, 5);
    let (forked, fork_key) = latest(&rollback_dir);
    let fork_size = forked.checkpoint().expect("cp").size;
    assert!(fork_size > size2);
    let fp = proof(&rollback_dir, size2, fork_size);
    assert!(matches!(
        add_checkpoint(&state, &w, &forked, &fork_key, Some(&fp), false, 4),
        Err(WitnessError::Fork(_))
    ));

    // The appliance refuses to open the rolled-back, forked log against the cosigned checkpoint.
    let witnessed = tmp.path().join("witnessed.checkpoint");
    let cosigned2 = std::fs::read_to_string(&state).expect("state");
    std::fs::write(
        &witnessed,
        cosigned2.trim_start_matches("inferno-witness-state/v1\n"),
    )
    .expect("write");
    let strict = |dir: &Path| AuditConfig {
        witness_checkpoint: Some(witnessed.clone()),
        witness_keys: vec![w.verifier().render()],
        ..config(dir)
    };
    match open_with(&strict(&rollback_dir), Arc::new(StdFileOps)) {
        Err(AuditError::Witness(why)) => assert!(why.contains("not consistent"), "{why}"),
        other => panic!("forked log opened: {other:?}"),
    }
    let log = open_with(&strict(&log_dir), Arc::new(StdFileOps)).expect("the witnessed log opens");
    runtime().block_on(async { log.shutdown("test").await.expect("shutdown") });
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("dir") {
        let p = e.expect("entry").path();
        std::fs::copy(&p, to.join(p.file_name().expect("name"))).expect("copy");
    }
}

#[test]
fn events_round_trip_through_the_log() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = config(tmp.path());
    let log = open(&cfg);
    runtime().block_on(async {
        log.append(RecordBody::Event(SecurityEvent::GpuReady {
            ready: true,
            detail: "cc on".into(),
        }))
        .await
        .expect("append");
        log.shutdown("test").await.expect("shutdown");
    });
    assert!(verify(tmp.path(), &VerifyOptions::default()).intact());
}

#[test]
fn torn_checkpoint_write_is_trimmed_at_open() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = config(tmp.path());
    write_log(&cfg, 2);
    let ck = tmp.path().join("checkpoints.log");
    append_bytes(&ck, &[200, 0, 0, 0, 1, 2, 3]);
    let verdict = verify(tmp.path(), &VerifyOptions::default()).verdict();
    assert!(verdict.contains("checkpoints.log offset"), "{verdict}");
    let log = open(&cfg);
    runtime().block_on(async { log.shutdown("test").await.expect("shutdown") });
    let report = verify(tmp.path(), &VerifyOptions::default());
    assert!(report.intact(), "{}", report.verdict());
    assert!(all_segments_text(tmp.path()).contains("torn checkpoint write"));
}

fn all_segments_text(dir: &Path) -> String {
    std::fs::read_dir(dir)
        .expect("dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "seg"))
        .map(|e| String::from_utf8_lossy(&std::fs::read(e.path()).expect("read")).into_owned())
        .collect()
}

#[test]
fn removing_files_is_detected() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let pristine = tmp.path().join("pristine");
    write_log(&config(&pristine), 20);
    let cases: [(&str, &str); 3] = [
        ("checkpoints.log", "no signed checkpoint"),
        ("0000000000000000.seg", "expected segment 0"),
        ("0000000000000001.seg", "expected segment 1"),
    ];
    for (file, expected) in cases {
        let dir = tmp.path().join(format!("case-{file}"));
        copy_dir(&pristine, &dir);
        std::fs::remove_file(dir.join(file)).expect("remove");
        let verdict = verify(&dir, &VerifyOptions::default()).verdict();
        assert!(
            verdict.starts_with("VIOLATION") && verdict.contains(expected),
            "{file}: {verdict}"
        );
    }
    // The writer refuses to reopen a log whose checkpoints file was removed.
    let dir = tmp.path().join("case-checkpoints.log");
    match open_with(&config(&dir), Arc::new(StdFileOps)) {
        Err(AuditError::Corrupt { reason, .. }) => assert!(reason.contains("missing"), "{reason}"),
        other => panic!("opened a log without checkpoints: {other:?}"),
    }
    // Removing the newest segment leaves checkpoints that cover missing records.
    let dir = tmp.path().join("case-last");
    copy_dir(&pristine, &dir);
    std::fs::remove_file(last_segment(&dir)).expect("remove");
    let verdict = verify(&dir, &VerifyOptions::default()).verdict();
    assert!(verdict.contains("truncated"), "{verdict}");
}

/// Counts the fsyncs of segment files.
struct CountingSyncs(Arc<AtomicU64>);

struct CountingFile {
    inner: Box<dyn AppendFile>,
    syncs: Option<Arc<AtomicU64>>,
}

impl AppendFile for CountingFile {
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.inner.write_all(buf)
    }
    fn sync(&mut self) -> std::io::Result<()> {
        if let Some(syncs) = &self.syncs {
            syncs.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.sync()
    }
}

impl WrapFile for CountingSyncs {
    fn wrap(&self, path: &Path, inner: Box<dyn AppendFile>) -> Box<dyn AppendFile> {
        let segment = path.extension().is_some_and(|e| e == "seg");
        Box::new(CountingFile {
            inner,
            syncs: segment.then(|| Arc::clone(&self.0)),
        })
    }
}

#[test]
fn detached_records_share_the_next_fsync_and_precede_the_checkpoint() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = AuditConfig {
        segment_max_bytes: 1 << 20,
        ..config(tmp.path())
    };
    let syncs = Arc::new(AtomicU64::new(0));
    let log = open_with(
        &cfg,
        Arc::new(WrappedOps(CountingSyncs(Arc::clone(&syncs)))),
    )
    .expect("opens");
    let rt = runtime();
    let opened = syncs.load(Ordering::SeqCst);
    for i in 0..50 {
        log.append_detached(completion(&format!("d-{i}")))
            .expect("handed over");
    }
    // An awaited append is durable with every detached record before it, in one fsync.
    let index = rt.block_on(log.append(request("waited"))).expect("durable");
    assert_eq!(syncs.load(Ordering::SeqCst) - opened, 1);
    assert_eq!(log.durable_size(), index + 1);
    // Detached records alone are synced before the checkpoint that covers them.
    for i in 0..10 {
        log.append_detached(completion(&format!("e-{i}")))
            .expect("handed over");
    }
    let note = rt.block_on(log.checkpoint()).expect("checkpoint");
    assert_eq!(syncs.load(Ordering::SeqCst) - opened, 2);
    let size = SignedNote::parse(&note)
        .and_then(|n| n.checkpoint())
        .expect("checkpoint")
        .size;
    assert_eq!(size, index + 11);
    assert_eq!(log.durable_size(), size);
    drop(log);
    let report = verify(tmp.path(), &VerifyOptions::default());
    assert!(report.intact(), "{report:?}");
    assert_eq!(report.size, size);
}

#[test]
fn under_load_one_fsync_serves_the_appends_of_a_commit_interval() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = AuditConfig {
        segment_max_bytes: 1 << 20,
        commit_interval_ms: 200,
        ..config(tmp.path())
    };
    let syncs = Arc::new(AtomicU64::new(0));
    let log = Arc::new(
        open_with(
            &cfg,
            Arc::new(WrappedOps(CountingSyncs(Arc::clone(&syncs)))),
        )
        .expect("opens"),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // Idle (the last fsync is older than the interval): an append is synced at once.
    std::thread::sleep(Duration::from_millis(250));
    let started = std::time::Instant::now();
    rt.block_on(log.append(request("idle"))).expect("durable");
    assert!(
        started.elapsed() < Duration::from_millis(150),
        "an idle log waited {:?}",
        started.elapsed()
    );
    // Busy: appends arriving every 5 ms, each awaited, share fsyncs.
    let before = syncs.load(Ordering::SeqCst);
    rt.block_on(async {
        let mut waits = Vec::new();
        for i in 0..20 {
            waits.push(tokio::spawn(log.append(request(&format!("busy-{i}")))));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for wait in waits {
            wait.await.expect("task").expect("durable");
        }
    });
    let used = syncs.load(Ordering::SeqCst) - before;
    assert!((1..=2).contains(&used), "{used} fsyncs for 20 appends");
    assert!(log.durable_size() >= 21);
    drop(log);
    assert!(verify(tmp.path(), &VerifyOptions::default()).intact());
}

#[test]
fn the_newest_record_time_bounds_the_clock_at_the_next_start() {
    let tmp = tempfile::tempdir().expect("tempdir");
    assert_eq!(
        newest_record_time(&tmp.path().join("absent")).expect("no log"),
        None
    );
    let cfg = config(tmp.path());
    let before = time::OffsetDateTime::now_utc();
    write_log(&cfg, 3);
    let after = time::OffsetDateTime::now_utc();
    let newest = newest_record_time(tmp.path())
        .expect("readable log")
        .expect("records");
    assert!(
        before <= newest && newest <= after,
        "{newest} not in {before}..{after}"
    );
}

/// The log in `dir` copied while `log` is still running: the disk as a `kill -9` leaves it.
fn crash_copy(dir: &Path) -> tempfile::TempDir {
    let copy = tempfile::tempdir().expect("tempdir");
    copy_dir(dir, copy.path());
    // The directory lock of the running writer is not part of the log.
    let _ = std::fs::remove_file(copy.path().join(inferno_audit::LOCK_FILE));
    copy
}

fn checkpoint_size(note: &str) -> u64 {
    SignedNote::parse(note)
        .and_then(|n| n.checkpoint())
        .expect("checkpoint")
        .size
}

/// Writes three awaited requests to a fresh log and returns the copy taken right after the last
/// was acknowledged, with the last segment's length before each of them.
fn acknowledged_then_crashed() -> (tempfile::TempDir, PathBuf, [u64; 3]) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = AuditConfig {
        segment_max_bytes: 1 << 20,
        ..config(tmp.path())
    };
    let log = open(&cfg);
    let rt = runtime();
    let seg = last_segment(tmp.path());
    let mut lens = [0; 3];
    for (i, len) in lens.iter_mut().enumerate() {
        *len = std::fs::metadata(&seg).expect("meta").len();
        rt.block_on(log.append(request(&format!("acked-{i}"))))
            .expect("acknowledged");
    }
    let copy = crash_copy(tmp.path());
    drop(log);
    let seg = last_segment(copy.path());
    (copy, seg, lens)
}

#[test]
fn every_acknowledged_record_is_covered_by_a_signed_checkpoint_when_acknowledged() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let log = open(&config(tmp.path()));
    let rt = runtime();
    for i in 0..20 {
        let appended = rt
            .block_on(log.append_with_leaf(request(&format!("r-{i}"))))
            .expect("acknowledged");
        let note = log.latest_checkpoint().expect("a checkpoint");
        assert!(
            checkpoint_size(&note) > appended.index,
            "record {} acknowledged under a checkpoint of size {}",
            appended.index,
            checkpoint_size(&note)
        );
        // The checkpoint is durable too: a crash copy verifies up to it.
        if i % 7 == 0 {
            let copy = crash_copy(tmp.path());
            let report = verify(copy.path(), &VerifyOptions::default());
            assert!(report.intact(), "{}", report.verdict());
            assert!(report.checkpointed_size > appended.index);
        }
    }
}

#[test]
fn cutting_acknowledged_records_at_a_frame_boundary_is_detected_by_verify_and_restart() {
    let (copy, seg, lens) = acknowledged_then_crashed();
    assert!(verify(copy.path(), &VerifyOptions::default()).intact());
    // Remove the last acknowledged record exactly at its frame boundary: no torn frame remains.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .and_then(|f| f.set_len(lens[2]))
        .expect("truncate");
    let report = verify(copy.path(), &VerifyOptions::default());
    assert!(!report.intact(), "a cut log verified: {}", report.verdict());
    assert!(
        report.verdict().contains("truncated"),
        "{}",
        report.verdict()
    );
    let cfg = AuditConfig {
        segment_max_bytes: 1 << 20,
        ..config(copy.path())
    };
    match open_with(&cfg, Arc::new(StdFileOps)) {
        Err(AuditError::Corrupt { reason, .. }) => {
            assert!(reason.contains("truncated or rolled back"), "{reason}")
        }
        Ok(_) => panic!("the restart signed a log missing an acknowledged record"),
        Err(other) => panic!("expected a corrupt log, got {other}"),
    }
}

#[test]
fn a_forged_acknowledged_record_with_a_recomputed_crc_chain_is_detected() {
    let (copy, seg, lens) = acknowledged_then_crashed();
    let mut bytes = std::fs::read(&seg).expect("read");
    let [_, previous, last] = lens.map(|l| usize::try_from(l).expect("len"));
    // The chain value the last frame follows is the CRC of the frame before it.
    let prev_crc = u32::from_le_bytes(bytes[previous + 4..previous + 8].try_into().expect("4"));
    let payload = &mut bytes[last + 8..];
    let text = String::from_utf8(payload.to_vec()).expect("utf-8 record");
    let forged = text.replacen("key-1", "key-9", 1);
    assert_ne!(forged, text);
    payload.copy_from_slice(forged.as_bytes());
    let len = u32::try_from(forged.len()).expect("len").to_le_bytes();
    let crc = crc32c::crc32c_append(crc32c::crc32c_append(prev_crc, &len), forged.as_bytes());
    bytes[last + 4..last + 8].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&seg, &bytes).expect("write");
    let report = verify(copy.path(), &VerifyOptions::default());
    assert!(
        !report.intact(),
        "a forged log verified: {}",
        report.verdict()
    );
    assert!(
        report
            .verdict()
            .contains("does not match the signed checkpoint"),
        "{}",
        report.verdict()
    );
    let cfg = AuditConfig {
        segment_max_bytes: 1 << 20,
        ..config(copy.path())
    };
    assert!(matches!(
        open_with(&cfg, Arc::new(StdFileOps)),
        Err(AuditError::Corrupt { .. })
    ));
}

#[test]
fn unacknowledged_records_past_the_last_checkpoint_are_reported_at_the_next_start() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = AuditConfig {
        segment_max_bytes: 1 << 20,
        ..config(tmp.path())
    };
    let log = open(&cfg);
    let rt = runtime();
    rt.block_on(log.append(request("acked")))
        .expect("acknowledged");
    for i in 0..3 {
        log.append_detached(completion(&format!("detached-{i}")))
            .expect("handed over");
    }
    // Wait until the detached records are on disk (written, not signed).
    let seg = last_segment(tmp.path());
    let written = std::fs::metadata(&seg).expect("meta").len();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::fs::metadata(&seg).expect("meta").len() == written {
        assert!(
            std::time::Instant::now() < deadline,
            "detached records never written"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
    let copy = crash_copy(tmp.path());
    drop(log);
    let cfg = AuditConfig {
        segment_max_bytes: 1 << 20,
        ..config(copy.path())
    };
    let log = open(&cfg);
    rt.block_on(log.shutdown("test")).expect("shutdown");
    let all = all_segments_text(copy.path());
    assert!(
        all.contains("unacknowledged record(s)") && all.contains("signed at this start"),
        "no recovery event for the unsigned tail"
    );
    assert!(verify(copy.path(), &VerifyOptions::default()).intact());
}
