//! The start-up timeline of `inferno serve`: how long each phase took, logged as one line when
//! serving starts, and a progress bar of the bytes read and uploaded while stderr is a terminal.

use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::backend::BackendPhases;

/// The phases of one start-up, measured as they finish. Phases may overlap (kernel compilation,
/// the KV cache, the product choice and graph capture run during the upload; the GPU context
/// opens, and the weights start to reach it, while a plaintext model is read), so they need not
/// add up to the total.
#[derive(Debug)]
pub(crate) struct Timeline {
    started: Instant,
    /// Starting the server: TLS identity, audit log, listening socket, hardening.
    pub server: Duration,
    /// Reading and hashing the plaintext files, or releasing the key and reading, decrypting
    /// and hashing a sealed model.
    pub read_hash: Duration,
    /// Parsing configuration, tokenizer, template and weight headers from the buffers.
    pub parse: Duration,
    /// Collecting and appraising the start-up evidence.
    pub attest: Duration,
    /// The backend's phases.
    pub backend: BackendPhases,
    /// Starting the engine on the backend.
    pub engine: Duration,
}

impl Timeline {
    /// Time since the start.
    pub(crate) fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// A timeline whose total counts from now.
    pub(crate) fn start() -> Self {
        Self {
            started: Instant::now(),
            server: Duration::ZERO,
            read_hash: Duration::ZERO,
            parse: Duration::ZERO,
            attest: Duration::ZERO,
            backend: BackendPhases::default(),
            engine: Duration::ZERO,
        }
    }

    /// Logs the timeline as one line, in milliseconds (`start-up timeline`).
    pub(crate) fn log(&self) {
        let ms = |d: Duration| d.as_millis() as u64;
        tracing::info!(
            server_ms = ms(self.server),
            read_hash_ms = ms(self.read_hash),
            parse_ms = ms(self.parse),
            attest_ms = ms(self.attest),
            context_ms = ms(self.backend.context),
            kernels_ms = ms(self.backend.kernels),
            upload_ms = ms(self.backend.weights),
            gemm_selection_ms = ms(self.backend.gemm_selection),
            graphs_ms = ms(self.backend.graphs),
            engine_ms = ms(self.engine),
            total_ms = ms(self.started.elapsed()),
            "start-up timeline"
        );
    }
}

/// A byte-count progress bar on stderr when stderr is a terminal. Otherwise (systemd, a pipe)
/// the bar is hidden and a thread logs its progress instead: a line when a phase starts
/// (`reading`, `decrypting`, `uploading`: the upload includes the kernels' compilation), every
/// [`PROGRESS_LOG_INTERVAL`] while it runs, and one when the bar finishes.
pub(crate) fn progress_bar() -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        let bar = ProgressBar::hidden();
        let weak = bar.downgrade();
        std::thread::Builder::new()
            .name("progress-log".to_owned())
            .spawn(move || log_progress(&weak))
            .ok();
        return bar;
    }
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg:>10} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar
}

/// How often a hidden progress bar's state is logged while a phase runs.
pub(crate) const PROGRESS_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// Logs the state of a hidden progress bar until it finishes or is dropped (then with the state
/// last seen: a bar dropped within one poll of its last change is still reported).
fn log_progress(bar: &indicatif::WeakProgressBar) {
    let log = |what: &str, phase: &str, (done, total): (u64, u64), elapsed: Duration| {
        tracing::info!(
            phase,
            bytes = done,
            total_bytes = total,
            percent = (done * 100).checked_div(total).unwrap_or(0),
            elapsed_ms = elapsed.as_millis() as u64,
            "start-up progress: {what}"
        );
    };
    let mut phase = String::new();
    let mut bytes = (0, 0);
    let mut last_line = Instant::now();
    let mut phase_started = Instant::now();
    while let Some(bar) = bar.upgrade() {
        let message = bar.message();
        bytes = (bar.position(), bar.length().unwrap_or(0));
        if bar.is_finished() {
            log("finished", &message, bytes, phase_started.elapsed());
            return;
        }
        if message != phase && !message.is_empty() {
            phase = message;
            phase_started = Instant::now();
            last_line = Instant::now();
            log("started", &phase, bytes, Duration::ZERO);
        } else if !phase.is_empty() && last_line.elapsed() >= PROGRESS_LOG_INTERVAL {
            last_line = Instant::now();
            log("running", &phase, bytes, phase_started.elapsed());
        }
        drop(bar);
        std::thread::sleep(Duration::from_millis(50));
    }
    let phase = if phase.is_empty() { "loading" } else { &phase };
    log("finished", phase, bytes, phase_started.elapsed());
}
