//! The thread-safe handle through which callers submit requests to the engine thread.

use std::sync::Arc;

use super::request::{GenerationEvent, GenerationRequest};

/// Why the engine refused a request at submission.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The waiting queue is full; retry later (HTTP 429).
    #[error("the request queue is full")]
    QueueFull,
    /// Prompt plus `max_tokens` cannot fit the context or the whole KV cache.
    #[error(
        "the prompt has {prompt} tokens and max_tokens is {max_tokens}, over the limit of {limit} tokens"
    )]
    TooLong {
        /// Prompt length.
        prompt: usize,
        /// Requested completion length.
        max_tokens: usize,
        /// The limit that was exceeded.
        limit: usize,
    },
    /// The engine has shut down.
    #[error("the engine has stopped")]
    Stopped,
}

/// A point-in-time view of the engine, for metrics and health.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineStats {
    /// Sequences scheduled in the running set.
    pub running: usize,
    /// Sequences waiting for admission (including preempted ones).
    pub waiting: usize,
    /// Physical KV blocks in total.
    pub kv_blocks_total: usize,
    /// KV blocks held by live sequences.
    pub kv_blocks_used: usize,
    /// Prompt tokens looked up in the prefix cache, since start.
    pub prefix_cache_queries: u64,
    /// Of those, tokens found, since start.
    pub prefix_cache_hits: u64,
    /// Sequences preempted (and later recomputed), since start.
    pub preemptions: u64,
}
