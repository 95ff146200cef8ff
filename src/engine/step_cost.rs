//! Measured step costs, and the prefill budget they allow while sequences are decoding.
//!
//! Chunked prefill puts prompt chunks into the same steps as running decodes. A chunk of
//! `max_batched_tokens` tokens can make a step several times longer than a decode-only step, and
//! every running stream then waits that long for its next token. Instead of a fixed chunk size,
//! the engine measures what its steps cost on this backend and this model:
//! - a decode-only step, per bucket of decode rows (1, 2, 3–4, 5–8, ...);
//! - each prefill token on top of the decode part of a mixed step (a ratio estimator: the
//!   decayed sum of extra time over the decayed sum of prefill tokens, so large and small chunks
//!   weigh by their size).
//!
//! While sequences decode, a step may carry as many prefill tokens as fit in
//! `(stall_limit - 1) x` the decode-only step time, at least [`MIN_PREFILL_TOKENS`] so that
//! prompts always progress. When the decode-only time of the running rows' bucket has not been
//! measured yet, the step carries those rows alone, once, to measure it: without that probe a
//! freshly started engine under load would form only mixed steps, never learn what a decode step
//! costs, and give every step the configured maximum, stalling every stream (the first serving
//! run after a start had four times the later runs' p99 inter-token latency). With nothing
//! decoding, or before any prompt token's cost is measured, the step takes the configured
//! maximum.
//!
//! A backend may run some token counts more cheaply than others (the CUDA backend replays graphs
//! captured for token-count buckets, padding a step up to the next one): a budget computed while
//! sequences decode is then rounded down to the largest such count that still carries
//! [`MIN_PREFILL_TOKENS`] prompt tokens (unless it exceeds them all), so a step under load fills
//! its bucket exactly.

use std::time::Duration;

/// Prefill tokens a step may always carry, whatever the measured costs say.
pub const MIN_PREFILL_TOKENS: usize = 64;

/// Buckets of decode rows: bucket `b` holds `2^(b-1) < rows <= 2^b`.
const BUCKETS: usize = 20;

/// Weight of the newest measurement in the running estimates.
const SMOOTHING: f64 = 0.2;

/// The engine's running estimates of its step costs (see the module documentation).
#[derive(Debug, Clone)]
pub struct StepCosts {
    decode_seconds: [Option<f64>; BUCKETS],
    extra_seconds: f64,
    extra_tokens: f64,
    stall_limit: f64,
    max_tokens: usize,
    step_sizes: Vec<usize>,
}

impl StepCosts {
    /// Estimates for steps of at most `max_tokens` tokens; `stall_limit` is the most a step
    /// carrying prefill may take, as a multiple of a decode-only step (1.0 or less: no limit).
    pub fn new(stall_limit: f64, max_tokens: usize) -> Self {
        Self {
            decode_seconds: [None; BUCKETS],
            extra_seconds: 0.0,
            extra_tokens: 0.0,
            stall_limit,
            max_tokens,
            step_sizes: Vec::new(),
        }
    }

    /// The same estimates, with budgets rounded down to the token counts the backend runs most
    /// cheaply (`Backend::step_sizes`, ascending).
    pub fn with_step_sizes(self, step_sizes: &[usize]) -> Self {
        Self {
            step_sizes: step_sizes.to_vec(),
            ..self
        }
    }

    /// Records a step of `decode_rows` one-token rows and `prefill_tokens` prompt tokens that
    /// took `elapsed`.
    pub fn record(&mut self, decode_rows: usize, prefill_tokens: usize, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        if prefill_tokens == 0 {
            if decode_rows > 0 {
                let slot = &mut self.decode_seconds[bucket(decode_rows)];
                *slot = Some(slot.map_or(seconds, |old| old + SMOOTHING * (seconds - old)));
            }
            return;
        }
        // A prefill-only step still pays what a one-row decode step pays (the weights are read
        // once either way); without a decode estimate yet the whole step counts as prefill.
        let base = self.decode_estimate(decode_rows.max(1)).unwrap_or(0.0);
        self.extra_seconds =
            (1.0 - SMOOTHING) * self.extra_seconds + SMOOTHING * (seconds - base).max(0.0);
        self.extra_tokens =
            (1.0 - SMOOTHING) * self.extra_tokens + SMOOTHING * prefill_tokens as f64;
    }

    /// The most tokens the next step may carry when `decode_rows` sequences are decoding: the
    /// decode rows plus the prefill tokens the stall limit allows, within the configured maximum.
    pub fn token_budget(&self, decode_rows: usize) -> usize {
        if decode_rows == 0 || self.stall_limit <= 1.0 {
            return self.max_tokens;
        }
        if self.decode_seconds[bucket(decode_rows)].is_none() {
            return decode_rows;
        }
        let (Some(decode), Some(per_token)) = (
            self.decode_estimate(decode_rows),
            self.seconds_per_prefill_token(),
        ) else {
            return self.max_tokens;
        };
        let allowed = if per_token > 0.0 {
            ((self.stall_limit - 1.0) * decode / per_token).round() as usize
        } else {
            self.max_tokens
        };
        let budget = decode_rows
            .saturating_add(allowed.max(MIN_PREFILL_TOKENS))
            .min(self.max_tokens);
        if self
            .step_sizes
            .last()
            .is_none_or(|&largest| budget > largest)
        {
            return budget;
        }
        let floor = decode_rows.saturating_add(MIN_PREFILL_TOKENS);
        self.step_sizes
            .iter()
            .copied()
            .filter(|&size| (floor..=budget).contains(&size))
            .max()
            .unwrap_or(budget)
    }

    /// The measured time of a decode-only step of `rows` rows: its bucket's, else the nearest
    /// measured bucket's.
    pub fn decode_estimate(&self, rows: usize) -> Option<f64> {
        let wanted = bucket(rows);
        (0..BUCKETS)
            .filter_map(|b| self.decode_seconds[b].map(|s| (b.abs_diff(wanted), s)))
            .min_by_key(|&(distance, _)| distance)
            .map(|(_, seconds)| seconds)
    }

    /// The measured extra time per prefill token of a mixed step.
    pub fn seconds_per_prefill_token(&self) -> Option<f64> {
        (self.extra_tokens > 0.0).then(|| self.extra_seconds / self.extra_tokens)
    }
}

fn bucket(rows: usize) -> usize {
    let b = rows.max(1).next_power_of_two().trailing_zeros() as usize;
    b.min(BUCKETS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn an_unmeasured_decode_bucket_gets_one_decode_only_step() {
        let mut costs = StepCosts::new(1.5, 2048);
        costs.record(0, 1000, ms(20));
        assert_eq!(costs.token_budget(8), 8, "the 8-row bucket is probed");
        costs.record(8, 0, ms(10));
        assert!(costs.token_budget(8) > 8, "then prompts join again");
        assert_eq!(costs.token_budget(16), 16, "a new bucket is probed too");
    }

    #[test]
    fn nothing_measured_or_nothing_decoding_takes_the_maximum() {
        let mut costs = StepCosts::new(1.5, 2048);
        costs.record(8, 0, ms(10));
        assert_eq!(costs.token_budget(8), 2048, "no prefill cost measured yet");
        costs.record(8, 1000, ms(30));
        assert_eq!(costs.token_budget(0), 2048, "nothing decoding");
        assert_eq!(StepCosts::new(1.0, 2048).token_budget(8), 2048, "limit off");
    }

    #[test]
    fn the_budget_keeps_a_mixed_step_within_the_stall_limit() {
        let mut costs = StepCosts::new(1.5, 2048);
        // Decode-only steps of 64 rows take 10 ms; 64 rows plus 1000 prompt tokens take 30 ms:
        // 20 us per prefill token.
        for _ in 0..20 {
            costs.record(64, 0, ms(10));
            costs.record(64, 1000, ms(30));
        }
        let per_token = costs.seconds_per_prefill_token().expect("measured");
        assert!((per_token - 20e-6).abs() < 1e-9, "{per_token}");
        // Half a decode step (5 ms) of prefill: 250 tokens, plus the 64 decode rows.
        assert_eq!(costs.token_budget(64), 64 + 250);
        // A looser limit allows more, never beyond the maximum.
        let mut loose = costs.clone();
        loose.stall_limit = 3.0;
        assert_eq!(loose.token_budget(64), 64 + 1000);
        loose.stall_limit = 100.0;
        assert_eq!(loose.token_budget(64), 2048);
    }

    #[test]
    fn a_budget_under_load_fills_a_step_size_of_the_backend() {
        let sizes = [64, 128, 160, 192, 224, 256, 320, 384];
        let mut costs = StepCosts::new(1.5, 2048).with_step_sizes(&sizes);
        for _ in 0..20 {
            costs.record(64, 0, ms(10));
            costs.record(64, 1000, ms(30));
        }
        // 64 + 250 = 314 tokens allowed: the step fills the 256-token size.
        assert_eq!(costs.token_budget(64), 256);
        // No size between 100 + 64 and 100 + 250: the budget stands.
        let mut wide = StepCosts::new(1.5, 2048).with_step_sizes(&[128, 512]);
        for _ in 0..20 {
            wide.record(100, 0, ms(10));
            wide.record(100, 1000, ms(30));
        }
        assert_eq!(wide.token_budget(100), 100 + 250);
        // A budget beyond the largest size stands.
        let mut loose = costs.clone();
        loose.stall_limit = 3.0;
        assert_eq!(loose.token_budget(64), 64 + 1000);
        // Probes and budgets with nothing decoding are not rounded.
        assert_eq!(costs.token_budget(0), 2048);
        assert_eq!(
            costs.token_budget(200),
            200,
            "an unmeasured bucket is probed"
        );
    }

    #[test]
    fn prompts_always_progress() {
        let mut costs = StepCosts::new(1.1, 2048);
        for _ in 0..20 {
            costs.record(4, 0, ms(1));
            costs.record(4, 2000, ms(500));
        }
        assert_eq!(costs.token_budget(4), 4 + MIN_PREFILL_TOKENS);
    }

    #[test]
    fn decode_times_are_kept_per_bucket_of_rows() {
        let mut costs = StepCosts::new(1.5, 2048);
        costs.record(1, 0, ms(6));
        costs.record(60, 0, ms(11));
        assert_eq!(costs.decode_estimate(1), Some(0.006));
        assert_eq!(costs.decode_estimate(64), Some(0.011));
        assert_eq!(costs.decode_estimate(33), Some(0.011));
        assert_eq!(
            costs.decode_estimate(2),
            Some(0.006),
            "the nearest measured bucket"
        );
        assert_eq!(StepCosts::new(1.5, 2048).decode_estimate(4), None);
    }
}
