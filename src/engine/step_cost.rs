//! Measured step costs, and the prefill budget they allow while sequences are decoding.
//!
//! Chunked prefill puts prompt chunks into the same steps as running decodes. A chunk of
//! `max_batched_tokens` tokens can make a step several times longer than a decode-only step, and
//! every running stream then waits that long for its next token. Instead of a fixed chunk size,
//! the engine measures what its steps cost on this backend and this model:
//! - a decode-only step, per bucket of decode rows (1, 2, 3–4, 5–8, ...), with the context its
//!   rows attended to (the KV tokens the step read);
//! - each prefill token on top of the decode part of a mixed step (a ratio estimator: the
//!   decayed sum of extra time over the decayed sum of prefill tokens, so large and small chunks
//!   weigh by their size).
//!
//! While sequences decode, a step may carry as many prefill tokens as fit in
//! `(stall_limit - 1) x` the reference decode step, at least [`MIN_PREFILL_TOKENS`] so that
//! prompts always progress. The reference is the decode-only step of the rows running now, unless
//! requests wait for admission: then it is the step of the batch the engine is filling (the
//! running and waiting sequences, within the sequence limit), extrapolated along the measured
//! cost per decode row. Streams admitted into a batch that is still filling would otherwise be
//! protected against the step time of a batch they are about to grow: under a backlog the budget
//! then shrank with the decode step, fewer requests ran at once, and a faster decode kernel
//! lowered throughput.
//!
//! A decode step's measurement is used only near the context it was measured at: when the running
//! rows' KV tokens have moved more than [`KV_DRIFT`] from it (and more than [`KV_DRIFT_FLOOR`]
//! tokens), or the bucket was never measured,
//! the step carries those rows alone, once, to measure it. Without that probe a freshly started
//! engine under load would form only mixed steps, never learn what a decode step costs, and give
//! every step the configured maximum, stalling every stream (the first serving run after a start
//! had four times the later runs' p99 inter-token latency); and a measurement taken when a bucket
//! was first reached, at short contexts, would go on pricing its steps after their contexts had
//! grown, charging the growth to the prompt tokens. With nothing decoding, or before any prompt
//! token's cost is measured, the step takes the configured maximum.
//!
//! A backend may run some token counts more cheaply than others (the CUDA backend replays graphs
//! captured for token-count buckets, padding a step up to the next one): a budget computed while
//! sequences decode is then rounded down to the largest such count that still carries
//! [`MIN_PREFILL_TOKENS`] prompt tokens (unless it exceeds them all), so a step under load fills
//! its bucket exactly.

use std::time::Duration;

/// Prefill tokens a step may always carry, whatever the measured costs say.
pub const MIN_PREFILL_TOKENS: usize = 64;

/// How far (a fraction of the measured value) the decoding rows' KV tokens may move from a decode
/// step's measurement before the step is measured again.
pub const KV_DRIFT: f64 = 0.2;

/// KV tokens the decoding rows may always move from a measurement: at short contexts the
/// attention they add is small next to the weights' read, and a few rows' contexts grow by a
/// fifth within a few steps.
pub const KV_DRIFT_FLOOR: usize = 2048;

/// Buckets of decode rows: bucket `b` holds `2^(b-1) < rows <= 2^b`.
const BUCKETS: usize = 20;

/// Weight of the newest measurement in the running estimates.
const SMOOTHING: f64 = 0.2;

/// The decode part of the next step: what the step costs without prompt tokens, and what the
/// engine is filling towards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DecodeLoad {
    /// Sequences decoding one token each.
    pub rows: usize,
    /// Tokens of context those rows attend to, summed (the KV tokens the step reads).
    pub kv_tokens: usize,
    /// Rows the batch would hold with every waiting request admitted, within the sequence limit
    /// (never fewer than `rows`).
    pub target_rows: usize,
}

/// One bucket's decode-only step time, and the step it was last measured on.
#[derive(Debug, Clone, Copy, PartialEq)]
struct DecodeSample {
    seconds: f64,
    rows: usize,
    kv_tokens: usize,
}

impl DecodeSample {
    /// Whether `kv_tokens` is within [`KV_DRIFT`] of this measurement's, or within
    /// [`KV_DRIFT_FLOOR`] tokens of it.
    fn holds_for(&self, kv_tokens: usize) -> bool {
        let allowed = (KV_DRIFT * self.kv_tokens as f64).max(KV_DRIFT_FLOOR as f64);
        kv_tokens.abs_diff(self.kv_tokens) as f64 <= allowed
    }
}

/// The engine's running estimates of its step costs (see the module documentation).
#[derive(Debug, Clone)]
pub struct StepCosts {
    decode: [Option<DecodeSample>; BUCKETS],
    extra_seconds: f64,
    extra_tokens: f64,
    /// `None`: no limit.
    stall_limit: Option<f64>,
    max_tokens: usize,
    step_sizes: Vec<usize>,
}

impl StepCosts {
    /// Estimates for steps of at most `max_tokens` tokens; `stall_limit` is the most a step
    /// carrying prefill may take, as a multiple of the reference decode step (1.0 or less: no
    /// limit).
    pub fn new(stall_limit: f64, max_tokens: usize) -> Self {
        Self {
            decode: [None; BUCKETS],
            extra_seconds: 0.0,
            extra_tokens: 0.0,
            stall_limit: super::config::itl_stall_limit_in_force(stall_limit),
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

    /// Records a step with the decode part `decode` (its `target_rows` unused) and
    /// `prefill_tokens` prompt tokens that took `elapsed`.
    pub fn record(&mut self, decode: DecodeLoad, prefill_tokens: usize, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        if prefill_tokens == 0 {
            if decode.rows > 0 {
                let slot = &mut self.decode[bucket(decode.rows)];
                let seconds = match slot {
                    Some(old) if old.holds_for(decode.kv_tokens) => {
                        old.seconds + SMOOTHING * (seconds - old.seconds)
                    }
                    _ => seconds,
                };
                *slot = Some(DecodeSample {
                    seconds,
                    rows: decode.rows,
                    kv_tokens: decode.kv_tokens,
                });
            }
            return;
        }
        // A prefill-only step still pays what a one-row decode step pays (the weights are read
        // once either way); without a decode estimate yet the whole step counts as prefill.
        let base = self.decode_estimate(decode.rows.max(1)).unwrap_or(0.0);
        self.extra_seconds =
            (1.0 - SMOOTHING) * self.extra_seconds + SMOOTHING * (seconds - base).max(0.0);
        self.extra_tokens =
            (1.0 - SMOOTHING) * self.extra_tokens + SMOOTHING * prefill_tokens as f64;
    }

    /// The most tokens the next step may carry with the decode part `decode`: the decode rows
    /// plus the prefill tokens the stall limit allows, within the configured maximum.
    pub fn token_budget(&self, decode: DecodeLoad) -> usize {
        let rows = decode.rows;
        let Some(stall_limit) = self.stall_limit.filter(|_| rows > 0) else {
            return self.max_tokens;
        };
        let Some(measured) = self.decode[bucket(rows)] else {
            return rows;
        };
        if !measured.holds_for(decode.kv_tokens) {
            return rows;
        }
        let Some(per_token) = self.seconds_per_prefill_token() else {
            return self.max_tokens;
        };
        let reference = self.reference_seconds(measured, decode);
        let allowed = if per_token > 0.0 {
            ((stall_limit - 1.0) * reference / per_token).round() as usize
        } else {
            self.max_tokens
        };
        let budget = rows
            .saturating_add(allowed.max(MIN_PREFILL_TOKENS))
            .min(self.max_tokens);
        if self
            .step_sizes
            .last()
            .is_none_or(|&largest| budget > largest)
        {
            return budget;
        }
        let floor = rows.saturating_add(MIN_PREFILL_TOKENS);
        self.step_sizes
            .iter()
            .copied()
            .filter(|&size| (floor..=budget).contains(&size))
            .max()
            .unwrap_or(budget)
    }

    /// The decode step the stall limit is taken against: `measured` (the running rows' step),
    /// extended to `decode.target_rows` along the line from the smallest measured decode step
    /// when more rows are to be admitted.
    fn reference_seconds(&self, measured: DecodeSample, decode: DecodeLoad) -> f64 {
        let more_rows = decode.target_rows.saturating_sub(decode.rows);
        let smallest = self.decode.iter().flatten().next();
        match smallest {
            Some(small) if more_rows > 0 && small.rows < measured.rows => {
                let per_row = ((measured.seconds - small.seconds)
                    / (measured.rows - small.rows) as f64)
                    .max(0.0);
                measured.seconds + per_row * more_rows as f64
            }
            _ => measured.seconds,
        }
    }

    /// The measured time of a decode-only step of `rows` rows: its bucket's, else the nearest
    /// measured bucket's.
    pub fn decode_estimate(&self, rows: usize) -> Option<f64> {
        let wanted = bucket(rows);
        (0..BUCKETS)
            .filter_map(|b| self.decode[b].map(|s| (b.abs_diff(wanted), s.seconds)))
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

    /// `rows` decoding rows of 1,000 tokens of context each, nothing waiting.
    fn rows(rows: usize) -> DecodeLoad {
        DecodeLoad {
            rows,
            kv_tokens: rows * 1000,
            target_rows: rows,
        }
    }

    #[test]
    fn an_unmeasured_decode_bucket_gets_one_decode_only_step() {
        let mut costs = StepCosts::new(1.5, 2048);
        costs.record(rows(0), 1000, ms(20));
        assert_eq!(costs.token_budget(rows(8)), 8, "the 8-row bucket is probed");
        costs.record(rows(8), 0, ms(10));
        assert!(costs.token_budget(rows(8)) > 8, "then prompts join again");
        assert_eq!(
            costs.token_budget(rows(16)),
            16,
            "a new bucket is probed too"
        );
    }

    #[test]
    fn a_decode_step_measured_at_another_context_is_measured_again() {
        let mut costs = StepCosts::new(1.5, 2048);
        costs.record(rows(0), 1000, ms(20));
        costs.record(rows(64), 0, ms(10));
        let grown = |kv_tokens| DecodeLoad {
            kv_tokens,
            ..rows(64)
        };
        assert!(
            costs.token_budget(grown(64_000 + 12_800)) > 64,
            "within the drift the measurement stands"
        );
        assert_eq!(
            costs.token_budget(grown(64_000 + 12_801)),
            64,
            "beyond it the rows run alone once"
        );
        assert_eq!(costs.token_budget(grown(51_000)), 64, "shrunk contexts too");
        // A few short contexts may move by the floor before they are measured again.
        let mut short = StepCosts::new(1.5, 2048);
        short.record(rows(0), 1000, ms(20));
        let few = |kv_tokens| DecodeLoad {
            rows: 4,
            kv_tokens,
            target_rows: 4,
        };
        short.record(few(400), 0, ms(5));
        assert!(short.token_budget(few(400 + KV_DRIFT_FLOOR)) > 4);
        assert_eq!(short.token_budget(few(401 + KV_DRIFT_FLOOR)), 4);
        // The probe replaces the old measurement rather than averaging with it.
        costs.record(grown(96_000), 0, ms(14));
        assert_eq!(costs.decode_estimate(64), Some(0.014));
        assert!(costs.token_budget(grown(96_000)) > 64);
    }

    #[test]
    fn nothing_measured_or_nothing_decoding_takes_the_maximum() {
        let mut costs = StepCosts::new(1.5, 2048);
        costs.record(rows(8), 0, ms(10));
        assert_eq!(
            costs.token_budget(rows(8)),
            2048,
            "no prefill cost measured yet"
        );
        costs.record(rows(8), 1000, ms(30));
        assert_eq!(costs.token_budget(rows(0)), 2048, "nothing decoding");
        assert_eq!(
            StepCosts::new(1.0, 2048).token_budget(rows(8)),
            2048,
            "limit off"
        );
    }

    #[test]
    fn the_budget_keeps_a_mixed_step_within_the_stall_limit() {
        let mut costs = StepCosts::new(1.5, 2048);
        // Decode-only steps of 64 rows take 10 ms; 64 rows plus 1000 prompt tokens take 30 ms:
        // 20 us per prefill token.
        for _ in 0..20 {
            costs.record(rows(64), 0, ms(10));
            costs.record(rows(64), 1000, ms(30));
        }
        let per_token = costs.seconds_per_prefill_token().expect("measured");
        assert!((per_token - 20e-6).abs() < 1e-9, "{per_token}");
        // Half a decode step (5 ms) of prefill: 250 tokens, plus the 64 decode rows.
        assert_eq!(costs.token_budget(rows(64)), 64 + 250);
        // A looser limit allows more, never beyond the maximum.
        let mut loose = costs.clone();
        loose.stall_limit = Some(3.0);
        assert_eq!(loose.token_budget(rows(64)), 64 + 1000);
        loose.stall_limit = Some(100.0);
        assert_eq!(loose.token_budget(rows(64)), 2048);
    }

    #[test]
    fn under_a_backlog_the_limit_is_taken_against_the_batch_being_filled() {
        let mut costs = StepCosts::new(1.5, 4096);
        // One row decodes in 4 ms, 64 rows in 10 ms: 6 ms over 63 rows, 95.2 us per row.
        costs.record(rows(1), 0, ms(4));
        for _ in 0..20 {
            costs.record(rows(64), 0, ms(10));
            costs.record(rows(64), 1000, ms(30));
        }
        assert_eq!(costs.token_budget(rows(64)), 64 + 250, "nothing waits");
        let backlog = DecodeLoad {
            target_rows: 256,
            ..rows(64)
        };
        // 10 ms + 192 more rows x 95.2 us = 28.29 ms; half of it at 20 us per token: 707.
        assert_eq!(costs.token_budget(backlog), 64 + 707);
        // Without a smaller measured step there is no line to extend: the running rows' step.
        let mut alone = StepCosts::new(1.5, 4096);
        for _ in 0..20 {
            alone.record(rows(64), 0, ms(10));
            alone.record(rows(64), 1000, ms(30));
        }
        assert_eq!(alone.token_budget(backlog), 64 + 250);
    }

    #[test]
    fn a_budget_under_load_fills_a_step_size_of_the_backend() {
        let sizes = [64, 128, 160, 192, 224, 256, 320, 384];
        let mut costs = StepCosts::new(1.5, 2048).with_step_sizes(&sizes);
        for _ in 0..20 {
            costs.record(rows(64), 0, ms(10));
            costs.record(rows(64), 1000, ms(30));
        }
        // 64 + 250 = 314 tokens allowed: the step fills the 256-token size.
        assert_eq!(costs.token_budget(rows(64)), 256);
        // No size between 100 + 64 and 100 + 250: the budget stands.
        let mut wide = StepCosts::new(1.5, 2048).with_step_sizes(&[128, 512]);
        for _ in 0..20 {
            wide.record(rows(100), 0, ms(10));
            wide.record(rows(100), 1000, ms(30));
        }
        assert_eq!(wide.token_budget(rows(100)), 100 + 250);
        // A budget beyond the largest size stands.
        let mut loose = costs.clone();
        loose.stall_limit = Some(3.0);
        assert_eq!(loose.token_budget(rows(64)), 64 + 1000);
        // Probes and budgets with nothing decoding are not rounded.
        assert_eq!(costs.token_budget(rows(0)), 2048);
        assert_eq!(
            costs.token_budget(rows(200)),
            200,
            "an unmeasured bucket is probed"
        );
    }

    #[test]
    fn prompts_always_progress() {
        let mut costs = StepCosts::new(1.1, 2048);
        for _ in 0..20 {
            costs.record(rows(4), 0, ms(1));
            costs.record(rows(4), 2000, ms(500));
        }
        assert_eq!(costs.token_budget(rows(4)), 4 + MIN_PREFILL_TOKENS);
    }

    #[test]
    fn decode_times_are_kept_per_bucket_of_rows() {
        let mut costs = StepCosts::new(1.5, 2048);
        costs.record(rows(1), 0, ms(6));
        costs.record(rows(60), 0, ms(11));
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
