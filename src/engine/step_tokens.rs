//! The tokens of each engine step as a histogram (vLLM's `vllm:iteration_tokens_total`):
//! cumulative since start, read with [`EngineStats`](super::EngineStats) at scrape time.

/// The upper bounds of the buckets (tokens per step); larger steps fall in the `+Inf` bucket.
pub const STEP_TOKEN_BUCKETS: [u64; 13] = [
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
];

/// Steps counted per bucket, and the tokens of all of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepTokens {
    /// `counts[i]`: steps of more tokens than bucket `i - 1`'s bound and at most bucket `i`'s;
    /// the last entry counts the steps above every bound.
    pub counts: [u64; STEP_TOKEN_BUCKETS.len() + 1],
    /// Tokens of every step counted (prompt and generated).
    pub sum: u64,
}

impl StepTokens {
    /// Counts a step that computed `tokens` tokens.
    pub fn observe(&mut self, tokens: usize) {
        let tokens = tokens as u64;
        let bucket = STEP_TOKEN_BUCKETS
            .iter()
            .position(|bound| tokens <= *bound)
            .unwrap_or(STEP_TOKEN_BUCKETS.len());
        self.counts[bucket] += 1;
        self.sum += tokens;
    }

    /// The number of steps counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_fall_in_the_bucket_of_their_token_count() {
        let mut steps = StepTokens::default();
        for tokens in [1, 2, 8, 9, 16384, 16385] {
            steps.observe(tokens);
        }
        assert_eq!(steps.counts[0], 1);
        assert_eq!(steps.counts[1], 2);
        assert_eq!(steps.counts[2], 1);
        assert_eq!(steps.counts[12], 1);
        assert_eq!(steps.counts[13], 1);
        assert_eq!(steps.count(), 6);
        assert_eq!(steps.sum, 1 + 2 + 8 + 9 + 16384 + 16385);
    }
}
