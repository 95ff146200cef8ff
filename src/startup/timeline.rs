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

/// A byte-count progress bar on stderr when stderr is a terminal; hidden otherwise, so that
/// logs and pipes never carry it.
pub(crate) fn progress_bar() -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
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
