//! The engine's per-request state.

use tokio::sync::mpsc::UnboundedSender;

use super::block_manager::BlockHash;
use super::config::BLOCK_SIZE;
use super::detokenize::IncrementalDecoder;
use super::kv_groups::BlockTables;
use super::request::{GenerationEvent, GenerationRequest, PromptLogprob};
use super::speculative::adaptive::Acceptance;
use super::stop::StopMatcher;
use crate::constrain::{TokenConstraint, TokenMask};

/// One generation in flight: its tokens, KV blocks, generator position and output channel.
#[derive(Debug)]
pub struct Sequence {
    /// Engine-wide identifier.
    pub id: u64,
    /// The request as submitted.
    pub request: GenerationRequest,
    /// Seed of the request's generator (the request's, or drawn at submission).
    pub seed: u64,
    /// Prompt followed by the generated tokens.
    pub tokens: Vec<u32>,
    /// Tokens whose keys and values are in the cache.
    pub num_computed: usize,
    /// Physical blocks holding positions `0..blocks.len() * BLOCK_SIZE`, one table per KV group
    /// (a sliding group's table gives back what its window left).
    pub blocks: BlockTables,
    /// Hash chain of the full blocks computed so far (`block_hashes[i]` covers block `i`).
    pub block_hashes: Vec<BlockHash>,
    /// Blocks already registered in the prefix cache.
    pub registered_blocks: usize,
    /// Prompt tokens served from the prefix cache at first admission.
    pub cached_tokens: usize,
    /// Turns generated tokens into text.
    pub decoder: IncrementalDecoder,
    /// Holds back text that may begin a stop string.
    pub stop: StopMatcher,
    /// Where events go; a closed channel means the caller went away.
    pub events: UnboundedSender<GenerationEvent>,
    /// Whether the sequence has been admitted at least once (prefix-cache statistics count once).
    pub admitted_before: bool,
    /// When the scheduler first admitted it (queue time ends, prefill begins).
    pub first_scheduled: Option<std::time::Instant>,
    /// The request's grammar state, advanced with every generated token. The engine takes it
    /// out while a worker thread computes its next mask.
    pub constraint: Option<TokenConstraint>,
    /// The allowed-token mask for the next sampled token (or why it could not be computed),
    /// computed after the previous token was accepted and consumed when the next one is.
    pub next_mask: Option<Result<TokenMask, String>>,
    /// An embedding request: its last prompt token's hidden state is returned and nothing is
    /// generated.
    pub embed: bool,
    /// Tokens proposed to follow the sequence, verified in the next step (speculative decoding;
    /// empty when it proposes none).
    pub draft: Vec<u32>,
    /// The tokens of a verification row as scheduled: the last token, then the proposals.
    pub verify: Vec<u32>,
    /// Its recent acceptance of proposals (adaptive number of proposals).
    pub acceptance: Acceptance,
    /// With prompt logprobs asked for: the logprob of each prompt token (the first `None`),
    /// filled while the prompt is computed.
    pub prompt_logprobs: Option<Vec<Option<PromptLogprob>>>,
}

impl Sequence {
    /// The generated tokens.
    pub fn output(&self) -> &[u32] {
        &self.tokens[self.request.prompt.len()..]
    }

    /// Tokens still to be computed before the next token can be sampled.
    pub fn pending(&self) -> usize {
        self.tokens.len() - self.num_computed
    }

    /// The positions a decode row of this sequence attends to (its whole context), or `None`
    /// when the sequence has more than its next token to compute (it is prefilling).
    pub fn decode_context(&self) -> Option<usize> {
        (self.pending() == 1).then_some(self.tokens.len())
    }

    /// Whether the scheduled row of `num_tokens` tokens verifies proposals (it computes more
    /// than the tokens still pending).
    pub fn verifies(&self, num_tokens: usize) -> bool {
        num_tokens > self.pending()
    }

    /// Blocks needed to hold `positions` tokens.
    pub fn blocks_for(positions: usize) -> usize {
        positions.div_ceil(BLOCK_SIZE)
    }
}

impl Sequence {
    /// A new sequence for `request`, whose events go to `events`, watching for stop strings
    /// with `stop`. Without a seed in the request, one is drawn from the operating system's
    /// generator.
    pub fn new(
        id: u64,
        request: GenerationRequest,
        stop: StopMatcher,
        events: UnboundedSender<GenerationEvent>,
    ) -> Self {
        let seed = request.sampling.seed.unwrap_or_else(rand::random);
        Self {
            id,
            seed,
            tokens: request.prompt.clone(),
            num_computed: 0,
            blocks: BlockTables::default(),
            block_hashes: Vec::new(),
            registered_blocks: 0,
            cached_tokens: 0,
            decoder: IncrementalDecoder::new(),
            stop,
            events,
            admitted_before: false,
            first_scheduled: None,
            constraint: request.constraint.as_ref().map(|c| c.start()),
            next_mask: None,
            embed: false,
            draft: Vec::new(),
            verify: Vec::new(),
            acceptance: Acceptance::default(),
            prompt_logprobs: request
                .prompt_logprobs
                .map(|_| vec![None; request.prompt.len()]),
            request,
        }
    }
}
