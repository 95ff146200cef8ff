//! What a caller submits to the engine and what it gets back.

/// How the next token is drawn from the model's distribution. The defaults are greedy decoding
/// with no penalties.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; `0.0` selects the most likely token (greedy).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` disables the filter.
    pub top_k: u32,
    /// Keep the smallest set of tokens whose probability mass reaches `top_p`; `1.0` disables it.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times the top token's; `0.0` disables it.
    pub min_p: f32,
    /// Subtracted once from the logit of every token already generated (OpenAI semantics).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was already generated.
    pub frequency_penalty: f32,
    /// Divides positive (multiplies negative) logits of tokens seen in the prompt or output; `1.0`
    /// disables it (Hugging Face semantics).
    pub repetition_penalty: f32,
    /// Seed of the request's random generator. Without one, the engine draws a seed.
    pub seed: Option<u64>,
    /// Added to the raw logits of the listed tokens before the penalties (OpenAI `logit_bias`;
    /// each bias within `-100..=100`), sorted by token id without duplicates, at most
    /// [`MAX_LOGIT_BIAS_TOKENS`] entries.
    pub logit_bias: Vec<(u32, f32)>,
}

/// The most `logit_bias` entries a request may carry: device samplers reserve room for this many
/// `(token, bias)` pairs per row in a step's packed inputs.
pub const MAX_LOGIT_BIAS_TOKENS: usize = 1024;

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            seed: None,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Whether the parameters reduce to picking the most likely token.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }

    /// Whether any penalty changes the logits.
    pub fn has_penalties(&self) -> bool {
        self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
            || self.repetition_penalty != 1.0
    }
}

/// When generation ends.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StopParams {
    /// The most tokens to generate.
    pub max_tokens: usize,
    /// Strings that end generation; the matched string is not emitted.
    pub stop_strings: Vec<String>,
    /// Extra token ids that end generation (on top of the model's EOS ids).
    pub stop_token_ids: Vec<u32>,
    /// Keep generating past EOS (benchmarks).
    pub ignore_eos: bool,
}

/// One generation submitted to the engine.
#[derive(Debug, Clone)]
pub struct GenerationRequest {
    /// Identifier used in logs and events (the API's request id, with a choice suffix for n > 1).
    pub id: String,
    /// The prompt, already tokenized.
    pub prompt: Vec<u32>,
    /// How tokens are drawn.
    pub sampling: SamplingParams,
    /// When to stop.
    pub stop: StopParams,
    /// `Some(k)` returns the chosen token's log-probability and the `k` most likely alternatives.
    pub logprobs: Option<u32>,
    /// `Some(k)` also returns the log-probability of every prompt token and its `k` most likely
    /// alternatives (vLLM's `prompt_logprobs`; the first token has none), in
    /// [`GenerationEvent::Finished`]. The whole prompt is computed: the prefix cache is not
    /// used for it.
    pub prompt_logprobs: Option<u32>,
    /// Salt of the prefix-cache hash chain: requests with different salts never share cached
    /// blocks. The server derives it from the principal unless the cache is shared.
    pub cache_salt: u64,
    /// The grammar the output must follow (structured outputs, enforced tool calls).
    pub constraint: Option<crate::constrain::CompiledConstraint>,
}

/// The log-probability of a generated token and of the most likely alternatives at its step.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// Log-probability of the chosen token.
    pub logprob: f32,
    /// The most likely tokens with their log-probabilities, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// The log-probability of a prompt token given the tokens before it (prompt logprobs).
#[derive(Debug, Clone, PartialEq)]
pub struct PromptLogprob {
    /// Log-probability of the prompt token.
    pub logprob: f32,
    /// Its rank: one more than the number of tokens the model found more likely.
    pub rank: u32,
    /// The most likely tokens with their log-probabilities, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// What ended a generation that stopped on a request's own stop condition (vLLM's
/// `stop_reason`). Serializes as the string or the token id itself.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(untagged)]
pub enum StopReason {
    /// A stop string matched (it is not part of the output).
    String(String),
    /// A token of the request's `stop_token_ids` was sampled.
    TokenId(u32),
}

/// Why a generation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// An EOS token, a complete grammar (`None`), or a stop string or stop token of the request.
    Stop(Option<StopReason>),
    /// `max_tokens` or the context length was reached.
    Length,
    /// The caller went away.
    Cancelled,
    /// The backend failed; the message is safe to show the client.
    Error(String),
}

impl FinishReason {
    /// The OpenAI `finish_reason` string.
    pub fn as_openai_str(&self) -> &'static str {
        match self {
            FinishReason::Stop(_) => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Error(_) => "error",
        }
    }

    /// The stop string or stop token that ended the generation, if one of the request's did.
    pub fn stop_reason(&self) -> Option<&StopReason> {
        match self {
            FinishReason::Stop(reason) => reason.as_ref(),
            _ => None,
        }
    }
}

/// What the engine streams back for one request.
#[derive(Debug, Clone, PartialEq)]
pub enum GenerationEvent {
    /// A generated token. `text` is the new, complete UTF-8 text it adds; it can be empty while a
    /// multi-byte character or a possible stop string is still pending.
    Token {
        /// The token id.
        token: u32,
        /// Newly decoded text.
        text: String,
        /// Present when the request asked for logprobs.
        logprob: Option<TokenLogprob>,
    },
    /// The final hidden state (after the model's final norm) of an embedding request's last
    /// prompt token, sent just before its `Finished` event
    /// ([`crate::engine::EngineHandle::submit_embedding`]).
    Hidden {
        /// One value per hidden dimension.
        state: Vec<f32>,
    },
    /// The last event of every request.
    Finished {
        /// Why it ended.
        reason: FinishReason,
        /// Text released at the end (held back while it could have begun a stop string).
        text: String,
        /// Prompt length in tokens.
        prompt_tokens: usize,
        /// Tokens generated.
        completion_tokens: usize,
        /// Prompt tokens served from the prefix cache.
        cached_tokens: usize,
        /// With prompt logprobs asked for: one per prompt token, the first `None`.
        prompt_logprobs: Option<Vec<Option<PromptLogprob>>>,
        /// When the scheduler first admitted the request (`None`: never scheduled).
        scheduled_at: Option<std::time::Instant>,
    },
}
