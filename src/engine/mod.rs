//! The continuous-batching engine shared by every backend.
//!
//! The engine owns all per-request state (prompt, generated tokens, sampling parameters, random
//! generator position, stop conditions, KV block table) and drives a [`Backend`] one step at a
//! time. A step mixes chunked prefills and decodes under a token budget; see `docs/engine.md`.

pub mod backend;
mod block_manager;
pub mod config;
mod core;
pub(crate) mod detokenize;
pub mod handle;
pub mod kv_groups;
pub mod request;
pub mod sampling;
mod scheduler;
mod sequence;
pub mod speculative;
mod step_cost;
pub mod step_tokens;
mod stop;

pub use backend::{
    Backend, BackendError, BatchRow, KvCacheShape, PositionOutput, SampleSpec, SampledToken,
    StepOutput,
};
pub use config::{
    BLOCK_SIZE, DERIVE_BLOCKS_PER_SEQ, EngineConfig, KvCacheDtype, MAX_NUM_SEQS_CAP,
    derive_max_num_seqs, itl_stall_limit_in_force,
};
pub use core::{Engine, EngineError, ModelInfo};
pub use handle::{EngineHandle, EngineStats, GenerationStream, SubmitError};
pub use kv_groups::{FREED_BLOCK, KvGroups};
pub use request::{
    FinishReason, GenerationEvent, GenerationRequest, MAX_LOGIT_BIAS_TOKENS, PromptLogprob,
    SamplingParams, StopParams, StopReason, TokenLogprob,
};
pub use speculative::{SpeculativeConfig, SpeculativeMethod};
pub use stop::{MAX_STOP_BYTES, StopError};
