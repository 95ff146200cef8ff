//! The log writer: one dedicated thread that batches appends (group commit), fsyncs, signs a
//! checkpoint over each group with a waiting caller, and only then answers its appends.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use time::OffsetDateTime;
use tokio::sync::oneshot;

use crate::config::AuditConfig;
use crate::error::AuditError;
use crate::fileops::{AppendFile, FileOps};
use crate::frame::{FRAME_HEADER_LEN, encode_frame};
use crate::lock::DirLock;
use crate::merkle::Frontier;
use crate::note::{Checkpoint, NoteSigner, VerifierKey};
use crate::record::{EvidenceBlob, RECORD_VERSION, Record, RecordBody, SecurityEvent};
use crate::recovery::{check_witness, recover};
use crate::scan::{CHECKPOINTS_FILE, checkpoints_header};
use crate::segment::{SegmentHeader, segment_path};

/// The most appends committed by one fsync.
const MAX_BATCH: usize = 4096;

/// What the appliance tells the log about itself when it opens it.
#[derive(Debug, Clone)]
pub struct StartInfo {
    /// The software version, recorded in the start event.
    pub software_version: String,
    /// Attestation evidence whose runtime data binds this run's checkpoint key.
    pub evidence: Vec<EvidenceBlob>,
}

type Reply<T> = oneshot::Sender<Result<T, AuditError>>;

/// Where a durable record landed: its leaf index and its leaf hash (RFC 9162 `leaf_hash` of the
/// record's payload). Together they are the record's receipt: an inclusion proof against a
/// signed checkpoint then shows the record is in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// The record's leaf index.
    pub index: u64,
    /// The record's leaf hash.
    pub leaf: crate::merkle::Hash,
}

enum Command {
    /// A record to append; with a reply, the writer answers once the record is durable;
    /// without, it is durable before the next checkpoint.
    Append(Box<RecordBody>, OffsetDateTime, Option<Reply<Appended>>),
    Checkpoint(Reply<String>),
    Shutdown(String, Reply<String>),
}

#[derive(Default)]
struct Shared {
    failure: Mutex<Option<String>>,
    latest_checkpoint: RwLock<Option<String>>,
    durable_size: AtomicU64,
}

/// A record to write and the time the writer accepted it.
type Pending = (RecordBody, OffsetDateTime);

impl Shared {
    fn failure(&self) -> Option<String> {
        self.failure.lock().ok().and_then(|f| f.clone())
    }

    fn fail(&self, why: String) {
        tracing::error!(reason = %why, "audit log failed; refusing all further records");
        if let Ok(mut f) = self.failure.lock() {
            f.get_or_insert(why);
        }
    }
}

struct Writer {
    dir: PathBuf,
    ops: Arc<dyn FileOps>,
    signer: NoteSigner,
    origin: String,
    segment: u64,
    segment_file: Box<dyn AppendFile>,
    segment_len: u64,
    segment_header_len: u64,
    segment_max: u64,
    chain: u32,
    frontier: Frontier,
    checkpoints: Box<dyn AppendFile>,
    checkpoints_chain: u32,
    checkpointed_size: Option<u64>,
    last_checkpoint_at: Instant,
    every_records: u64,
    every: Option<Duration>,
    shared: Arc<Shared>,
    /// The directory lock, released when the writer thread ends.
    _lock: DirLock,
    /// Records written to the segment file but not yet fsynced.
    unsynced: bool,
    /// The least time from the end of one segment fsync to the start of the next.
    commit_interval: Duration,
    /// When the last segment fsync ended.
    last_sync: Instant,
    /// Reused serialisation buffer of one record.
    payload: Vec<u8>,
    /// Reused buffer of the frames of one batch.
    frames: Vec<u8>,
    /// The leaf hashes of the group being written, in order (answered to waiting callers).
    group_leaves: Vec<crate::merkle::Hash>,
}

/// Creates segment file `header.segment` with its header, durably; returns it and its length.
fn new_segment(
    ops: &dyn FileOps,
    dir: &Path,
    header: &SegmentHeader,
) -> Result<(Box<dyn AppendFile>, u64), AuditError> {
    let path = segment_path(dir, header.segment);
    let bytes = header.encode();
    let mut file = ops.create_new(&path).map_err(io_err("creating", &path))?;
    file.write_all(&bytes).map_err(io_err("writing", &path))?;
    file.sync().map_err(io_err("syncing", &path))?;
    ops.sync_dir(dir).map_err(io_err("syncing", dir))?;
    Ok((file, bytes.len() as u64))
}

fn io_err(what: &str, path: &Path) -> impl FnOnce(std::io::Error) -> AuditError {
    let context = format!("{what} {}", path.display());
    move |e| AuditError::io(context, e)
}

impl Writer {
    fn create_segment(&mut self, number: u64) -> Result<(), AuditError> {
        let (file, len) = new_segment(
            self.ops.as_ref(),
            &self.dir,
            &SegmentHeader {
                segment: number,
                first_index: self.frontier.size(),
                prev_crc: self.chain,
                origin: self.origin.clone(),
            },
        )?;
        self.segment = number;
        self.segment_file = file;
        self.segment_len = len;
        self.segment_header_len = len;
        Ok(())
    }

    /// Writes (and empties) a batch of records; with `sync`, makes everything written so far
    /// durable. Returns the index of the first record.
    fn write_records(&mut self, batch: &mut Vec<Pending>, sync: bool) -> Result<u64, AuditError> {
        let first = self.frontier.size();
        self.group_leaves.clear();
        let mut frames = std::mem::take(&mut self.frames);
        let mut payload = std::mem::take(&mut self.payload);
        let written = self.encode_and_write(batch, &mut frames, &mut payload);
        frames.clear();
        payload.clear();
        self.frames = frames;
        self.payload = payload;
        written?;
        if sync {
            self.sync_segment()?;
        }
        Ok(first)
    }

    /// Frames each record into `frames` (serialised once, into the reused `payload` buffer),
    /// rotating segments as needed, and writes the frames to the segment file.
    fn encode_and_write(
        &mut self,
        batch: &mut Vec<Pending>,
        frames: &mut Vec<u8>,
        payload: &mut Vec<u8>,
    ) -> Result<(), AuditError> {
        for (body, time) in batch.drain(..) {
            let record = Record {
                v: RECORD_VERSION,
                index: self.frontier.size(),
                time,
                body,
            };
            payload.clear();
            record.encode_into(payload)?;
            let frame_len = (payload.len() + FRAME_HEADER_LEN) as u64;
            let has_frames = self.segment_len > self.segment_header_len || !frames.is_empty();
            if has_frames && self.segment_len + frames.len() as u64 + frame_len > self.segment_max {
                self.write_frames(frames)?;
                // A rotation never leaves unsynced records behind in the older segment.
                self.sync_segment()?;
                self.create_segment(self.segment + 1)?;
            }
            self.chain = encode_frame(self.chain, payload, frames);
            let leaf = crate::merkle::leaf_hash(payload);
            self.frontier.push(leaf);
            self.group_leaves.push(leaf);
        }
        self.write_frames(frames)
    }

    /// Writes `frames` to the current segment (without fsync) and clears it.
    fn write_frames(&mut self, frames: &mut Vec<u8>) -> Result<(), AuditError> {
        if frames.is_empty() {
            return Ok(());
        }
        let path = segment_path(&self.dir, self.segment);
        self.segment_file
            .write_all(frames)
            .map_err(io_err("writing", &path))?;
        self.segment_len += frames.len() as u64;
        self.unsynced = true;
        frames.clear();
        Ok(())
    }

    /// Makes every record written so far durable.
    fn sync_segment(&mut self) -> Result<(), AuditError> {
        if self.unsynced {
            let path = segment_path(&self.dir, self.segment);
            self.segment_file.sync().map_err(io_err("syncing", &path))?;
            self.unsynced = false;
            self.last_sync = Instant::now();
        }
        self.shared
            .durable_size
            .store(self.frontier.size(), Ordering::Release);
        Ok(())
    }

    /// Signs and durably stores a checkpoint of the current tree (if it grew since the last).
    fn checkpoint(&mut self) -> Result<String, AuditError> {
        // Records appended without a waiting caller become durable here at the latest.
        self.sync_segment()?;
        let size = self.frontier.size();
        if self.checkpointed_size == Some(size)
            && let Ok(latest) = self.shared.latest_checkpoint.read()
            && let Some(text) = latest.as_ref()
        {
            return Ok(text.clone());
        }
        let note = self
            .signer
            .sign_checkpoint(&Checkpoint {
                origin: self.origin.clone(),
                size,
                root: self.frontier.root(),
            })
            .render();
        let mut buf = Vec::new();
        let chain = encode_frame(self.checkpoints_chain, note.as_bytes(), &mut buf);
        let path = self.dir.join(CHECKPOINTS_FILE);
        self.checkpoints
            .write_all(&buf)
            .map_err(io_err("writing", &path))?;
        self.checkpoints.sync().map_err(io_err("syncing", &path))?;
        self.checkpoints_chain = chain;
        self.checkpointed_size = Some(size);
        self.last_checkpoint_at = Instant::now();
        if let Ok(mut latest) = self.shared.latest_checkpoint.write() {
            *latest = Some(note.clone());
        }
        Ok(note)
    }

    fn checkpoint_due(&self) -> bool {
        let pending = self.frontier.size() - self.checkpointed_size.unwrap_or(0);
        pending > 0
            && ((self.every_records > 0 && pending >= self.every_records)
                || self
                    .every
                    .is_some_and(|t| self.last_checkpoint_at.elapsed() >= t))
    }

    fn time_to_checkpoint(&self) -> Duration {
        let pending = self.checkpointed_size != Some(self.frontier.size());
        match self.every {
            Some(t) if pending => t.saturating_sub(self.last_checkpoint_at.elapsed()),
            _ => Duration::from_secs(3600),
        }
    }

    /// How long a new group should keep gathering appends before it is written: the rest of
    /// the commit interval since the last fsync ended. Under load one fsync (and one wakeup of
    /// this thread) then serves a larger group; an idle log (last fsync long ago) waits for
    /// nothing.
    fn gather_wait(&self) -> Option<Duration> {
        self.commit_interval
            .checked_sub(self.last_sync.elapsed())
            .filter(|wait| !wait.is_zero())
    }

    /// Runs one step that may fail; a failure puts the log in the failed state for good.
    fn guarded<T>(
        &mut self,
        step: impl FnOnce(&mut Self) -> Result<T, AuditError>,
    ) -> Result<T, AuditError> {
        if let Some(why) = self.shared.failure() {
            return Err(AuditError::Failed(why));
        }
        step(self).map_err(|e| {
            self.shared.fail(e.to_string());
            AuditError::Failed(e.to_string())
        })
    }

    fn run(mut self, rx: mpsc::Receiver<Command>) {
        // Reused from group to group: no allocation per group once they have grown.
        let mut records: Vec<Pending> = Vec::new();
        let mut replies: Vec<(usize, Reply<Appended>)> = Vec::new();
        let mut others = Vec::new();
        loop {
            let first = match rx.recv_timeout(self.time_to_checkpoint()) {
                Ok(c) => c,
                Err(RecvTimeoutError::Timeout) => {
                    if self.checkpoint_due() {
                        let _ = self.guarded(Self::checkpoint);
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let _ = self.guarded(Self::checkpoint);
                    return;
                }
            };
            let mut next = Some(first);
            let mut gathered = false;
            loop {
                while let Some(cmd) = next {
                    match cmd {
                        Command::Append(body, time, reply) => {
                            if let Some(reply) = reply {
                                replies.push((records.len(), reply));
                            }
                            records.push((*body, time));
                        }
                        other => others.push(other),
                    }
                    next = if records.len() < MAX_BATCH && others.is_empty() {
                        rx.try_recv().ok()
                    } else {
                        None
                    };
                }
                if gathered || !others.is_empty() || records.len() >= MAX_BATCH {
                    break;
                }
                gathered = true;
                let Some(wait) = self.gather_wait() else {
                    break;
                };
                // Sleeping (rather than waiting on the channel) lets senders enqueue without
                // waking this thread: one wakeup per group instead of one per append.
                std::thread::sleep(wait);
                next = rx.try_recv().ok();
            }
            if !records.is_empty() {
                // Only a waiting caller needs an fsync now; the others are synced with the
                // next waiting caller's group or before the next checkpoint.
                let sync = !replies.is_empty();
                // No append is answered before a signed checkpoint covers it: whoever holds the
                // disk cannot then cut or edit an acknowledged record without breaking a
                // signature (see docs/audit-log.md, "Acknowledgement").
                let written = self.guarded(|w| {
                    let first = w.write_records(&mut records, sync)?;
                    if sync {
                        w.checkpoint()?;
                    }
                    Ok(first)
                });
                // A failed write leaves records behind; they are refused with the log.
                records.clear();
                match written {
                    Ok(first) => {
                        for (offset, reply) in replies.drain(..) {
                            let appended = self.group_leaves.get(offset).map(|leaf| Appended {
                                index: first + offset as u64,
                                leaf: *leaf,
                            });
                            let _ = reply.send(appended.ok_or(AuditError::Closed));
                        }
                    }
                    Err(e) => {
                        let why = e.to_string();
                        for (_, reply) in replies.drain(..) {
                            let _ = reply.send(Err(AuditError::Failed(why.clone())));
                        }
                    }
                }
            }
            for cmd in others.drain(..) {
                match cmd {
                    Command::Checkpoint(reply) => {
                        let _ = reply.send(self.guarded(Self::checkpoint));
                    }
                    Command::Shutdown(reason, reply) => {
                        let result = self.guarded(|w| {
                            let stop = SecurityEvent::Stopped { reason };
                            let mut stop =
                                vec![(RecordBody::Event(stop), OffsetDateTime::now_utc())];
                            w.write_records(&mut stop, true)?;
                            w.checkpoint()
                        });
                        let _ = reply.send(result);
                        return;
                    }
                    Command::Append(..) => {}
                }
            }
            if self.checkpoint_due() {
                let _ = self.guarded(Self::checkpoint);
            }
        }
    }
}

/// An open audit log. Appends are sent to the writer thread; each resolves once durable.
pub struct AuditLog {
    tx: mpsc::Sender<Command>,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    verifier: VerifierKey,
    origin: String,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog")
            .field("origin", &self.origin)
            .field("size", &self.durable_size())
            .finish_non_exhaustive()
    }
}

fn random_origin() -> Result<String, AuditError> {
    use ring::rand::SecureRandom as _;
    let mut id = [0u8; 8];
    ring::rand::SystemRandom::new()
        .fill(&mut id)
        .map_err(|_| AuditError::Config("random generation failed".into()))?;
    Ok(format!("inferno.audit/{}", hex::encode(id)))
}

impl AuditLog {
    /// Generates a fresh checkpoint signing key for the log in `config.dir`. The caller binds its
    /// public key ([`NoteSigner::verifier`]) into attestation evidence, then passes both to
    /// [`AuditLog::open`]. The log's origin is needed for the key name, so it is read from the
    /// directory (or chosen) here.
    pub fn generate_signer(config: &AuditConfig) -> Result<NoteSigner, AuditError> {
        let origin = existing_origin(&config.dir)?
            .or_else(|| config.origin.clone())
            .map_or_else(random_origin, Ok)?;
        Ok(NoteSigner::generate(&origin)?)
    }

    /// Opens (creating or recovering) the log in `config.dir`, records the start events and
    /// writes a first checkpoint signed by `signer`.
    pub fn open(
        config: &AuditConfig,
        ops: Arc<dyn FileOps>,
        signer: NoteSigner,
        start: StartInfo,
    ) -> Result<Self, AuditError> {
        let dir = config.dir.clone();
        crate::fileops::make_private_dir(&dir).map_err(io_err("creating", &dir))?;
        // Held until the writer thread ends: no second writer, no prune, while the log is open.
        let lock = DirLock::try_acquire(&dir)?;
        let rec = recover(&dir, ops.as_ref())?;
        if let Some(path) = &config.witness_checkpoint {
            check_witness(&dir, path, &config.witness_keys)?;
        }
        let verifier = signer.verifier();
        let origin = rec.origin.clone().unwrap_or_else(|| verifier.name.clone());
        if verifier.name != origin {
            return Err(AuditError::Config(format!(
                "signing key is named {:?} but the log's origin is {origin:?}",
                verifier.name
            )));
        }
        let ck_path = dir.join(CHECKPOINTS_FILE);
        let checkpoints = if rec.checkpoints_exist {
            ops.open_append(&ck_path)
                .map_err(io_err("opening", &ck_path))?
        } else {
            let mut f = ops
                .create_new(&ck_path)
                .map_err(io_err("creating", &ck_path))?;
            f.write_all(&checkpoints_header())
                .map_err(io_err("writing", &ck_path))?;
            f.sync().map_err(io_err("syncing", &ck_path))?;
            ops.sync_dir(&dir).map_err(io_err("syncing", &dir))?;
            f
        };
        let shared = Arc::new(Shared::default());
        if let Ok(mut latest) = shared.latest_checkpoint.write() {
            latest.clone_from(&rec.last_checkpoint);
        }
        // `segment_header_len` only prevents rotating out a segment that holds no frame; a
        // reopened segment is treated as holding frames.
        let (segment, segment_file, segment_len, segment_header_len) = match &rec.last_segment {
            Some((n, path, true)) => {
                let f = ops.open_append(path).map_err(io_err("opening", path))?;
                (*n, f, rec.last_segment_len, 0)
            }
            other => {
                let number = other.as_ref().map_or(0, |(n, _, _)| *n);
                let header = SegmentHeader {
                    segment: number,
                    first_index: rec.frontier.size(),
                    prev_crc: rec.chain,
                    origin: origin.clone(),
                };
                let (f, len) = new_segment(ops.as_ref(), &dir, &header)?;
                (number, f, len, len)
            }
        };
        let mut writer = Writer {
            dir: dir.clone(),
            ops,
            signer,
            origin: origin.clone(),
            segment,
            segment_file,
            segment_len,
            segment_header_len,
            segment_max: config.segment_max_bytes.max(1024),
            chain: rec.chain,
            frontier: rec.frontier.clone(),
            checkpoints,
            checkpoints_chain: rec.checkpoints_chain,
            checkpointed_size: None,
            last_checkpoint_at: Instant::now(),
            every_records: config.checkpoint_every_records,
            every: (config.checkpoint_every_seconds > 0)
                .then(|| Duration::from_secs(config.checkpoint_every_seconds)),
            shared: Arc::clone(&shared),
            _lock: lock,
            unsynced: false,
            commit_interval: Duration::from_millis(config.commit_interval_ms),
            last_sync: Instant::now(),
            payload: Vec::new(),
            frames: Vec::new(),
            group_leaves: Vec::new(),
        };
        let now = OffsetDateTime::now_utc();
        let mut startup: Vec<Pending> = rec
            .events
            .into_iter()
            .map(|e| (RecordBody::Event(e), now))
            .collect();
        let current = verifier.render();
        startup.push((
            RecordBody::Event(SecurityEvent::Started {
                software_version: start.software_version,
                checkpoint_key: current.clone(),
                evidence: start.evidence,
            }),
            now,
        ));
        if let Some(previous) = rec.previous_key {
            startup.push((
                RecordBody::Event(SecurityEvent::SigningKeyChanged {
                    previous: Some(previous),
                    current,
                }),
                now,
            ));
        }
        writer.write_records(&mut startup, true)?;
        writer.checkpoint()?;
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(|e| AuditError::io("spawning the audit writer thread", e))?;
        tracing::info!(dir = %dir.display(), %origin, "audit log open");
        Ok(Self {
            tx,
            shared,
            thread: Mutex::new(Some(thread)),
            verifier,
            origin,
        })
    }

    /// Appends a record; the returned future resolves to its leaf index once it is durable and
    /// covered by a durable signed checkpoint ([`AuditLog::latest_checkpoint`]), or
    /// to an error if the log has failed (the caller must then refuse service). The record is
    /// handed to the writer at once: the caller may do other work before awaiting durability.
    pub fn append(
        &self,
        body: RecordBody,
    ) -> impl Future<Output = Result<u64, AuditError>> + Send + 'static + use<> {
        let appended = self.append_with_leaf(body);
        async move { appended.await.map(|appended| appended.index) }
    }

    /// As [`AuditLog::append`], resolving to the record's index and leaf hash (its receipt).
    pub fn append_with_leaf(
        &self,
        body: RecordBody,
    ) -> impl Future<Output = Result<Appended, AuditError>> + Send + 'static + use<> {
        let (reply, rx) = oneshot::channel();
        let sent = self.send(body, Some(reply));
        async move {
            sent?;
            rx.await.map_err(|_| AuditError::Closed)?
        }
    }

    /// Appends a record without waiting for it: it becomes durable with the next awaited
    /// append's group or before the next checkpoint, whichever comes first. Fails at once only
    /// if the log has already failed or is closed; a later write failure puts the log in its
    /// failed state (and is logged by the writer).
    pub fn append_detached(&self, body: RecordBody) -> Result<(), AuditError> {
        self.send(body, None)
    }

    fn send(&self, body: RecordBody, reply: Option<Reply<Appended>>) -> Result<(), AuditError> {
        if let Some(why) = self.shared.failure() {
            return Err(AuditError::Failed(why));
        }
        self.tx
            .send(Command::Append(
                Box::new(body),
                OffsetDateTime::now_utc(),
                reply,
            ))
            .map_err(|_| AuditError::Closed)
    }

    /// Forces a checkpoint now and returns it once durable.
    pub async fn checkpoint(&self) -> Result<String, AuditError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::Checkpoint(reply))
            .map_err(|_| AuditError::Closed)?;
        rx.await.map_err(|_| AuditError::Closed)?
    }

    /// Records a stop event, writes a final checkpoint and stops the writer thread.
    pub async fn shutdown(&self, reason: &str) -> Result<String, AuditError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::Shutdown(reason.to_owned(), reply))
            .map_err(|_| AuditError::Closed)?;
        let result = rx.await.map_err(|_| AuditError::Closed)?;
        self.join();
        result
    }

    fn join(&self) {
        let handle = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(h) = handle
            && h.join().is_err()
        {
            tracing::error!("audit writer thread panicked");
        }
    }

    /// Why the log failed, if it did (the server answers 503 while this is `Some`).
    pub fn failure(&self) -> Option<String> {
        self.shared.failure()
    }

    /// The latest durable signed checkpoint.
    pub fn latest_checkpoint(&self) -> Option<String> {
        self.shared
            .latest_checkpoint
            .read()
            .ok()
            .and_then(|c| c.clone())
    }

    /// The number of durable records.
    pub fn durable_size(&self) -> u64 {
        self.shared.durable_size.load(Ordering::Acquire)
    }

    /// The verifier key of this run's checkpoint signatures.
    pub fn verifier(&self) -> &VerifierKey {
        &self.verifier
    }

    /// The log's origin.
    pub fn origin(&self) -> &str {
        &self.origin
    }
}

/// The origin of an existing log in `dir` (from its first segment or prune anchor).
fn existing_origin(dir: &Path) -> Result<Option<String>, AuditError> {
    if !dir.exists() {
        return Ok(None);
    }
    if let Some(anchor) = crate::scan::read_anchor(dir)? {
        return Ok(Some(anchor.origin));
    }
    let segments = crate::segment::list_segments(dir).map_err(io_err("listing", dir))?;
    for (_, path) in segments {
        let bytes = std::fs::read(&path).map_err(io_err("reading", &path))?;
        if let Ok((h, _)) = SegmentHeader::decode(&bytes) {
            return Ok(Some(h.origin));
        }
    }
    Ok(None)
}

impl Drop for AuditLog {
    fn drop(&mut self) {
        let (tx, _) = mpsc::channel();
        drop(std::mem::replace(&mut self.tx, tx));
        self.join();
    }
}
