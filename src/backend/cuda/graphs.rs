//! CUDA graphs of the forward pass: whole decode steps, one per batch-size bucket, and the
//! segments of mixed steps between their attention launches, one set per token-count bucket.
//!
//! At start-up the backend captures its forward pass for a decode batch of each bucket size
//! (`plan::graph_buckets`), padded with padding rows. Every captured launch reads its per-step
//! values (token ids, positions, cache slots, block tables and their stride) from the packed
//! input buffer at a fixed device address, its split-K bound and GEMM algorithms are fixed per
//! bucket, and cuBLASLt's workspace is one fixed buffer; so a decode step only copies its packed
//! inputs, replays the bucket's graph and copies the results back.
//!
//! A step that carries prompt tokens cannot replay one graph: its attention launches depend on
//! how its tokens split into rows and tiles. Everything else depends only on its token count, so
//! for each token-count bucket (`plan::mixed_step_buckets`) the backend captures the segments
//! between attention launches (the embedding and layer 0 up to its attention; then per layer its
//! output projection, MLP and the next layer up to its attention; the last layer's MLP), pads the
//! step with unsampled tokens to the bucket, replays the segments and launches attention and the
//! sampled rows' logits eagerly between and after them (see `docs/cuda-backend.md`).

use cudarc::driver::{CudaGraph, DriverError};

use crate::engine::BackendError;

/// One captured, instantiated graph.
pub struct StepGraph {
    graph: CudaGraph,
}

// SAFETY: a CUDA graph may be used from any thread as long as calls on it are serialised; the
// backend that owns these graphs is used by one thread at a time (`&mut self` on every step) and
// binds its context to the calling thread before replaying.
unsafe impl Send for StepGraph {}

impl StepGraph {
    /// Wraps a captured graph.
    pub fn new(graph: CudaGraph) -> Self {
        Self { graph }
    }

    /// Replays the graph on the stream it was captured on.
    pub fn replay(&self) -> Result<(), DriverError> {
        self.graph.launch()
    }

    /// Uploads the graph's resources so that its first replay costs no set-up.
    pub fn upload(&self) -> Result<(), DriverError> {
        self.graph.upload()
    }
}

/// Graphs captured per bucket (a batch size or a token count), ascending by bucket, and how
/// often they were replayed.
pub struct BucketGraphs<T> {
    graphs: Vec<T>,
    buckets: Vec<usize>,
    replays: u64,
}

impl<T> Default for BucketGraphs<T> {
    fn default() -> Self {
        Self {
            graphs: Vec::new(),
            buckets: Vec::new(),
            replays: 0,
        }
    }
}

impl<T> BucketGraphs<T> {
    /// Adds the graphs of the next larger bucket.
    pub fn push(&mut self, bucket: usize, graphs: T) {
        self.buckets.push(bucket);
        self.graphs.push(graphs);
    }

    /// The buckets captured, ascending.
    pub fn buckets(&self) -> &[usize] {
        &self.buckets
    }

    /// The graphs of `bucket`.
    pub fn get(&self, bucket: usize) -> Result<&T, BackendError> {
        let at = self
            .buckets
            .iter()
            .position(|&b| b == bucket)
            .ok_or_else(|| {
                BackendError::Device(format!("no graphs captured for bucket {bucket}"))
            })?;
        Ok(&self.graphs[at])
    }

    /// Counts a step replayed from these graphs.
    pub fn count_replay(&mut self) {
        self.replays += 1;
    }

    /// Steps replayed from these graphs so far.
    pub fn replays(&self) -> u64 {
        self.replays
    }
}

/// The decode graphs, one whole forward pass per batch-size bucket (`plan::graph_buckets`).
pub type DecodeGraphs = BucketGraphs<StepGraph>;

/// The mixed-step segment graphs, the segments in forward order per token-count bucket
/// (`plan::mixed_step_buckets`).
pub type MixedStepGraphs = BucketGraphs<Vec<StepGraph>>;
