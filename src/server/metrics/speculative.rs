//! The speculative-decoding series: proposals, acceptance, and the tokens a verification step
//! yields.

use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::ModelLabel;
use crate::engine::EngineStats;

/// Counters of proposals and accepted tokens, and the two ratios since start.
pub(super) struct SpeculativeMetrics {
    verifications: Family<ModelLabel, Counter>,
    draft_tokens: Family<ModelLabel, Counter>,
    accepted_tokens: Family<ModelLabel, Counter>,
    acceptance_rate: Family<ModelLabel, Gauge<f64, AtomicU64>>,
    accepted_per_step: Family<ModelLabel, Gauge<f64, AtomicU64>>,
    /// Totals already folded into the counters: verifications, draft and accepted tokens.
    seen: Mutex<[u64; 3]>,
}

impl SpeculativeMetrics {
    /// Registers the series in `registry`.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            verifications: Family::default(),
            draft_tokens: Family::default(),
            accepted_tokens: Family::default(),
            acceptance_rate: Family::default(),
            accepted_per_step: Family::default(),
            seen: Mutex::new([0; 3]),
        };
        for (name, help, counter) in [
            (
                "inferno:spec_decode_num_drafts",
                "Speculative decoding: rows that verified proposed tokens",
                &metrics.verifications,
            ),
            (
                "inferno:spec_decode_num_draft_tokens",
                "Speculative decoding: tokens proposed",
                &metrics.draft_tokens,
            ),
            (
                "inferno:spec_decode_num_accepted_tokens",
                "Speculative decoding: proposed tokens accepted",
                &metrics.accepted_tokens,
            ),
        ] {
            registry.register(name, help, counter.clone());
        }
        registry.register(
            "inferno:spec_decode_acceptance_rate",
            "Speculative decoding: accepted over proposed tokens, since start",
            metrics.acceptance_rate.clone(),
        );
        registry.register(
            "inferno:spec_decode_accepted_tokens_per_step",
            "Speculative decoding: accepted proposals per verification step, since start (the step also yields the target's own token)",
            metrics.accepted_per_step.clone(),
        );
        metrics
    }

    /// Folds the engine's totals in.
    pub(super) fn observe(&self, label: &ModelLabel, stats: &EngineStats) {
        let totals = [
            stats.spec_verifications,
            stats.spec_draft_tokens,
            stats.spec_accepted_tokens,
        ];
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        for ((counter, total), earlier) in [
            &self.verifications,
            &self.draft_tokens,
            &self.accepted_tokens,
        ]
        .into_iter()
        .zip(totals)
        .zip(seen.iter_mut())
        {
            counter
                .get_or_create(label)
                .inc_by(total.saturating_sub(*earlier));
            *earlier = (*earlier).max(total);
        }
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        self.acceptance_rate
            .get_or_create(label)
            .set(ratio(stats.spec_accepted_tokens, stats.spec_draft_tokens));
        self.accepted_per_step
            .get_or_create(label)
            .set(ratio(stats.spec_accepted_tokens, stats.spec_verifications));
    }
}

#[cfg(test)]
mod tests {
    use crate::engine::{EngineConfig, EngineStats};
    use crate::server::metrics::{Format, Metrics, ServerState};

    #[test]
    fn proposals_acceptance_and_tokens_per_step_follow_the_engine() {
        let metrics = Metrics::new();
        let render = |stats: &EngineStats| {
            metrics.render(
                Some(("m", stats, &EngineConfig::default())),
                ServerState::default(),
                Format::Text,
                false,
            )
        };
        let mut stats = EngineStats {
            spec_verifications: 10,
            spec_draft_tokens: 40,
            spec_accepted_tokens: 20,
            ..EngineStats::default()
        };
        render(&stats);
        stats.spec_verifications = 20;
        stats.spec_draft_tokens = 80;
        stats.spec_accepted_tokens = 60;
        let text = render(&stats);
        let value = |name: &str| -> f64 {
            let prefix = format!("{name}{{model_name=\"m\"}} ");
            text.lines()
                .find_map(|line| line.strip_prefix(&prefix))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
        };
        assert_eq!(value("inferno:spec_decode_num_drafts_total"), 20.0);
        assert_eq!(value("inferno:spec_decode_num_draft_tokens_total"), 80.0);
        assert_eq!(value("inferno:spec_decode_num_accepted_tokens_total"), 60.0);
        assert_eq!(value("inferno:spec_decode_acceptance_rate"), 0.75);
        assert_eq!(value("inferno:spec_decode_accepted_tokens_per_step"), 3.0);
    }
}
