//! cuBLASLt's candidate algorithms timed at start-up per product shape, for the step row counts
//! above the small-M kernels' (`plan::tuned_rows`: the verification and mixed-step buckets),
//! and the fastest kept; the choices are stored with the small-M ones (`choices.rs`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::backend::cuda::choices::ChosenShape;
use crate::backend::cuda::launch::{Bf16, DevicePtr};
use crate::backend::cuda::plan;

use super::CudaBackend;

/// A product whose cuBLASLt algorithm is timed: `out[m, n] = x[m, k] · w[n, k]ᵀ` for the tuned
/// row counts up to `max_m`, on each of `weights` (one per layer) in turn.
pub(super) struct TunedProduct {
    /// Its name in the stored choices (as the small-M choices name it).
    pub(super) name: &'static str,
    pub(super) x: DevicePtr<Bf16>,
    pub(super) weights: Vec<DevicePtr<Bf16>>,
    pub(super) out: DevicePtr<f32>,
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) max_m: usize,
}

impl CudaBackend {
    /// For every product of `products` and tuned row count, times each of cuBLASLt's candidate
    /// algorithms (at most `gemm::MAX_CANDIDATES`, each over one graph replay of a product per
    /// layer) and makes the fastest the shape's algorithm (`plan::fastest_candidate`: the
    /// heuristic's first unless another is clearly faster, or when timing fails). Shapes in
    /// `stored` take the stored candidate. Returns the choices and how many shapes were timed.
    pub(super) fn choose_algorithms(
        &mut self,
        products: &[TunedProduct],
        stored: &HashMap<ChosenShape, usize>,
    ) -> (Vec<(ChosenShape, usize)>, usize) {
        const REPS: usize = 8;
        // Layers cycled through per timing: enough that no weight is read from L2 twice.
        const TIMED_LAYERS: usize = 16;
        let started = Instant::now();
        let rows = plan::tuned_rows(self.limits.max_rows, self.limits.max_tokens);
        let mut chosen = Vec::new();
        let mut timed = 0;
        let (mut first_total, mut best_total) = (Duration::ZERO, Duration::ZERO);
        for p in products.iter().filter(|p| !p.weights.is_empty()) {
            for &m in rows.iter().filter(|&&m| m <= p.max_m) {
                let dims = (m, p.n, p.k);
                let Ok(count) = self.gemm.candidates(dims) else {
                    continue;
                };
                let shape = ChosenShape {
                    product: p.name.to_string(),
                    m,
                    n: p.n,
                    k: p.k,
                };
                if let Some(&index) = stored.get(&shape)
                    && self.gemm.use_algorithm(dims, index)
                {
                    chosen.push((shape, index));
                    continue;
                }
                let reps = REPS.max(p.weights.len().min(TIMED_LAYERS));
                let mut times = Vec::with_capacity(count);
                for index in 0..count {
                    self.gemm.use_algorithm(dims, index);
                    let took = self.time_in_graph(reps, |backend, i| {
                        let w = p.weights[i % p.weights.len()];
                        backend.product(false, (p.x, w, p.out), dims)
                    });
                    times.push(match took {
                        Ok(t) => Some(t),
                        Err(e) => {
                            tracing::warn!(error = %e, m, n = p.n, k = p.k, index, "a cuBLASLt candidate could not be timed");
                            None
                        }
                    });
                }
                let best = plan::fastest_candidate(&times);
                self.gemm.use_algorithm(dims, best);
                if let (Some(Some(first)), Some(Some(fastest))) = (times.first(), times.get(best)) {
                    first_total += *first;
                    best_total += *fastest;
                }
                chosen.push((shape, best));
                timed += 1;
            }
        }
        tracing::info!(
            shapes = chosen.len(),
            timed,
            heuristic_us = first_total.as_micros() as u64,
            chosen_us = best_total.as_micros() as u64,
            ms = started.elapsed().as_millis() as u64,
            "cuBLASLt candidates timed for the step row counts above the small-M kernels'"
        );
        (chosen, timed)
    }
}
