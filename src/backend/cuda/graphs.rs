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

/// The decode graphs of a backend, ascending by bucket.
#[derive(Default)]
pub struct DecodeGraphs {
    graphs: Vec<StepGraph>,
    buckets: Vec<usize>,
    replays: u64,
}

impl DecodeGraphs {
    /// Adds the graph of the next larger bucket, `bucket` decode rows.
    pub fn push(&mut self, bucket: usize, graph: StepGraph) {
        self.buckets.push(bucket);
        self.graphs.push(graph);
    }

    /// The buckets captured, ascending.
    pub fn buckets(&self) -> &[usize] {
        &self.buckets
    }

    /// The bucket that holds `rows` decode rows, if a graph was captured for one.
    pub fn bucket_for(&self, rows: usize) -> Option<usize> {
        super::plan::bucket_for(&self.buckets, rows)
    }

    /// Replays the graph of `bucket` and counts the replay.
    pub fn replay(&mut self, bucket: usize) -> Result<(), BackendError> {
        let at = self
            .buckets
            .iter()
            .position(|&b| b == bucket)
            .ok_or_else(|| BackendError::Device(format!("no decode graph for {bucket} rows")))?;
        self.graphs[at]
            .replay()
            .map_err(|e| BackendError::Device(format!("replaying the decode graph: {e}")))?;
        self.replays += 1;
        Ok(())
    }

    /// Decode steps replayed from a graph so far.
    pub fn replays(&self) -> u64 {
        self.replays
    }
}

/// The mixed-step segment graphs of a backend, ascending by token-count bucket.
#[derive(Default)]
pub struct MixedStepGraphs {
    segments: Vec<Vec<StepGraph>>,
    buckets: Vec<usize>,
    replays: u64,
}

impl MixedStepGraphs {
    /// Adds the segments (in forward order) of the next larger bucket, `bucket` tokens.
    pub fn push(&mut self, bucket: usize, segments: Vec<StepGraph>) {
        self.buckets.push(bucket);
        self.segments.push(segments);
    }

    /// The buckets captured, ascending.
    pub fn buckets(&self) -> &[usize] {
        &self.buckets
    }

    /// The bucket whose segments serve a step of `tokens` tokens (`plan::mixed_bucket_for`).
    pub fn bucket_for(&self, tokens: usize) -> Option<usize> {
        super::plan::mixed_bucket_for(&self.buckets, tokens)
    }

    /// The segments of `bucket`, in forward order.
    pub fn segments(&self, bucket: usize) -> Result<&[StepGraph], BackendError> {
        let at = self
            .buckets
            .iter()
            .position(|&b| b == bucket)
            .ok_or_else(|| {
                BackendError::Device(format!("no mixed-step graphs for {bucket} tokens"))
            })?;
        Ok(&self.segments[at])
    }

    /// Counts a mixed step replayed from the segments.
    pub fn count_replay(&mut self) {
        self.replays += 1;
    }

    /// Mixed steps whose segments were replayed from graphs so far.
    pub fn replays(&self) -> u64 {
        self.replays
    }
}
