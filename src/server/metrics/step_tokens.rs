//! `vllm:iteration_tokens_total`: the engine's own per-step histogram
//! ([`StepTokens`](crate::engine::step_tokens::StepTokens)), exposed as a Prometheus histogram.
//! The engine counts every step; a scrape copies its totals here.

use std::sync::Mutex;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

use crate::engine::step_tokens::{STEP_TOKEN_BUCKETS, StepTokens};

/// The latest copy of the engine's step histogram.
#[derive(Debug, Default)]
pub(super) struct StepTokenHistogram(Mutex<StepTokens>);

impl StepTokenHistogram {
    /// Takes the engine's totals (read at scrape time).
    pub(super) fn set(&self, steps: &StepTokens) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = steps.clone();
    }
}

impl TypedMetric for StepTokenHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for StepTokenHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let steps = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        // Per-bucket counts, as the encoder expects (it accumulates them).
        let buckets: Vec<(f64, u64)> = STEP_TOKEN_BUCKETS
            .iter()
            .map(|bound| *bound as f64)
            .chain([f64::INFINITY])
            .zip(steps.counts)
            .collect();
        encoder.encode_histogram::<NoLabelSet>(steps.sum as f64, steps.count(), &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}
