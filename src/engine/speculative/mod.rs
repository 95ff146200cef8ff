//! Speculative decoding: a proposer guesses several next tokens of a sequence, one forward pass
//! of the target model over them verifies them all (inside the continuous batch), and the
//! accepted prefix plus the target's own next token are appended. Greedy rows give exactly the
//! tokens they give without it; sampled rows follow the standard rejection rule, so their output
//! distribution is the target model's. See `docs/engine.md`, "Speculative decoding".

pub mod adaptive;
pub mod ngram;
pub mod verify;

use serde::Deserialize;

/// The proposer (`--speculative`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SpeculativeMethod {
    /// Prompt lookup: n-grams of the request's own prompt and output, no extra model.
    Ngram,
    /// EAGLE-3 draft heads (not supported yet: refused at start).
    Eagle3,
}

/// The largest `num_speculative_tokens`.
pub const MAX_SPECULATIVE_TOKENS: usize = 16;

/// The `[speculative]` table. Without `method`, speculation is off.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SpeculativeConfig {
    /// The proposer; `None` turns speculation off.
    pub method: Option<SpeculativeMethod>,
    /// The most tokens proposed per sequence and step (`--num-speculative-tokens`).
    pub num_speculative_tokens: usize,
    /// The shortest n-gram prompt lookup matches.
    pub prompt_lookup_min: usize,
    /// The longest n-gram prompt lookup tries first.
    pub prompt_lookup_max: usize,
    /// Adapt the number of proposed tokens per sequence to its recent acceptance and the cost of
    /// a verified token at the current batch size, and stop proposing when it would not pay.
    /// `false` always proposes up to `num_speculative_tokens`.
    pub adaptive: bool,
    /// Test mode for performance predictions: accept each proposal with this probability
    /// whatever the target model says (the output is then not the model's). Proposals are
    /// padded to `num_speculative_tokens` with the last token when lookup finds fewer.
    pub forced_acceptance: Option<f64>,
}

impl Default for SpeculativeConfig {
    fn default() -> Self {
        Self {
            method: None,
            num_speculative_tokens: 4,
            prompt_lookup_min: 2,
            prompt_lookup_max: 4,
            adaptive: true,
            forced_acceptance: None,
        }
    }
}

/// A `[speculative]` setting that cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpeculativeConfigError {
    /// The method is not implemented yet.
    #[error("speculative decoding with {0} is not supported yet (use ngram)")]
    NotSupported(&'static str),
    /// A value is out of range.
    #[error("speculative.{field}: {reason}")]
    Range {
        /// The setting.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

impl SpeculativeConfig {
    /// Whether speculation is on.
    pub fn enabled(&self) -> bool {
        self.method.is_some()
    }

    /// Checks the settings; EAGLE-3 is refused until its draft heads are implemented.
    pub fn validate(&self) -> Result<(), SpeculativeConfigError> {
        if self.method == Some(SpeculativeMethod::Eagle3) {
            return Err(SpeculativeConfigError::NotSupported("eagle3"));
        }
        let range = |field, reason: String| Err(SpeculativeConfigError::Range { field, reason });
        if !(1..=MAX_SPECULATIVE_TOKENS).contains(&self.num_speculative_tokens) {
            return range(
                "num_speculative_tokens",
                format!("must be within 1..={MAX_SPECULATIVE_TOKENS}"),
            );
        }
        if self.prompt_lookup_min == 0 || self.prompt_lookup_min > self.prompt_lookup_max {
            return range(
                "prompt_lookup_min",
                "must be at least 1 and at most prompt_lookup_max".into(),
            );
        }
        if self.prompt_lookup_max > 64 {
            return range("prompt_lookup_max", "must be at most 64".into());
        }
        if let Some(share) = self.forced_acceptance
            && !(0.0..=1.0).contains(&share)
        {
            return range("forced_acceptance", "must be within 0..=1".into());
        }
        Ok(())
    }

    /// The proposal for a sequence whose tokens are `context`, at most `k` tokens.
    pub fn propose(&self, context: &[u32], k: usize) -> Vec<u32> {
        let mut draft = ngram::propose(context, self.prompt_lookup_min, self.prompt_lookup_max, k);
        if self.forced_acceptance.is_some()
            && let Some(&last) = context.last()
        {
            draft.resize(k, last);
        }
        draft
    }
}

/// Speculation counters since start (published in `EngineStats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecCounters {
    /// Rows verified (a sequence's step with at least one proposal).
    pub verifications: u64,
    /// Tokens proposed in them.
    pub draft_tokens: u64,
    /// Of those, accepted.
    pub accepted_tokens: u64,
}

impl SpecCounters {
    /// Counts one verified row.
    pub fn record(&mut self, proposed: usize, accepted: usize) {
        self.verifications += 1;
        self.draft_tokens += proposed as u64;
        self.accepted_tokens += accepted as u64;
    }
}

/// The cost of one more verified token of one row, in decode steps' worth of the batch's output:
/// the batch's `rows` times the measured seconds per extra token over the measured decode step
/// of that many rows; 0.1 until both are measured.
pub fn token_cost(rows: usize, seconds_per_token: Option<f64>, decode_step: Option<f64>) -> f64 {
    match (seconds_per_token, decode_step) {
        (Some(token), Some(step)) if step > 0.0 => rows.max(1) as f64 * token / step,
        _ => 0.1,
    }
}

#[cfg(test)]
mod tests;
