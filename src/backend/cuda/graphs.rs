//! CUDA graphs of the decode step, one per batch-size bucket.
//!
//! At start-up the backend captures its forward pass for a decode batch of each bucket size
//! (`plan::graph_buckets`), padded with padding tokens. Every captured launch reads its per-step
//! values (token ids, positions, cache slots, block tables and their stride) from the packed
//! input buffer at a fixed device address, its split-K bound and GEMM algorithms are fixed per
//! bucket, and cuBLASLt's workspace is one fixed buffer; so a decode step only copies its packed
//! inputs, replays the bucket's graph and copies the results back.

use cudarc::driver::{CudaGraph, DriverError};

use crate::engine::BackendError;

/// A captured decode forward pass for one batch size.
pub struct DecodeGraph {
    bucket: usize,
    graph: CudaGraph,
}

// SAFETY: a CUDA graph may be used from any thread as long as calls on it are serialised; the
// backend that owns these graphs is used by one thread at a time (`&mut self` on every step) and
// binds its context to the calling thread before replaying.
unsafe impl Send for DecodeGraph {}

impl DecodeGraph {
    /// Wraps the graph captured for `bucket` decode rows.
    pub fn new(bucket: usize, graph: CudaGraph) -> Self {
        Self { bucket, graph }
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
    graphs: Vec<DecodeGraph>,
    buckets: Vec<usize>,
    replays: u64,
}

impl DecodeGraphs {
    /// Adds the graph of the next larger bucket.
    pub fn push(&mut self, graph: DecodeGraph) {
        self.buckets.push(graph.bucket);
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
        let graph = self
            .graphs
            .iter()
            .find(|g| g.bucket == bucket)
            .ok_or_else(|| BackendError::Device(format!("no decode graph for {bucket} rows")))?;
        graph
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
