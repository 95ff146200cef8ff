//! How many tokens to propose for one sequence: from its recent acceptance and what an extra
//! verified token costs at the current batch size, speculation off when it would not pay.

/// Weight kept by the past at each verification (an exponential moving average over about five
/// verifications).
const DECAY: f64 = 0.8;

/// Longest pause, in steps, between two probes of a sequence for which speculation does not pay.
const MAX_BACKOFF: u32 = 64;

/// A sequence's recent acceptance, as a per-token acceptance probability.
#[derive(Debug, Clone, PartialEq)]
pub struct Acceptance {
    /// Decayed count of accepted proposals.
    accepted: f64,
    /// Decayed count of proposals judged (accepted ones plus the first rejected one of each
    /// verification; those after it were never judged).
    judged: f64,
    /// Steps still to run without speculation before the next probe.
    skip: u32,
    /// The pause after the next probe that does not pay.
    backoff: u32,
}

impl Default for Acceptance {
    /// A prior of one accepted proposal in two.
    fn default() -> Self {
        Self {
            accepted: 1.0,
            judged: 2.0,
            skip: 0,
            backoff: 2,
        }
    }
}

impl Acceptance {
    /// The estimated probability that a proposal is accepted.
    pub fn rate(&self) -> f64 {
        if self.judged > 0.0 {
            self.accepted / self.judged
        } else {
            0.0
        }
    }

    /// Records a verification of `proposed` tokens of which the first `accepted` were accepted.
    pub fn record(&mut self, proposed: usize, accepted: usize) {
        let rejected = usize::from(accepted < proposed);
        self.accepted = self.accepted * DECAY + accepted as f64;
        self.judged = self.judged * DECAY + (accepted + rejected) as f64;
    }

    /// How many tokens to propose, at most `k_max`, when one more verified token costs `cost`
    /// decode steps' worth of the batch's output (see `docs/engine.md`, "Speculative
    /// decoding"): the count that maximises the expected extra tokens `α + α² + … + αᵏ` less
    /// `k × cost`. When no count gains, none for a while, then a probe of one token, at
    /// doubling intervals (so a sequence whose text turns repetitive is found again).
    pub fn choose(&mut self, k_max: usize, cost: f64) -> usize {
        let alpha = self.rate();
        let (mut best, mut best_gain, mut gain, mut term) = (0, 0.0, 0.0, 1.0);
        for k in 1..=k_max {
            term *= alpha;
            gain += term - cost;
            if gain > best_gain + 1e-9 {
                (best, best_gain) = (k, gain);
            }
        }
        if best > 0 {
            self.backoff = 2;
            self.skip = 0;
            return best;
        }
        if self.skip > 0 {
            self.skip -= 1;
            return 0;
        }
        self.skip = self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        k_max.min(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn high_acceptance_proposes_many_low_acceptance_backs_off_and_probes() {
        let mut a = Acceptance::default();
        for _ in 0..10 {
            a.record(4, 4);
        }
        assert!(a.rate() > 0.9, "{}", a.rate());
        assert_eq!(a.choose(4, 0.05), 4);
        // Two of three judged proposals accepted (α ≈ 2/3): with a verified token costing 0.35,
        // the third proposal (α³ ≈ 0.30) no longer pays.
        for _ in 0..30 {
            a.record(4, 2);
        }
        assert!((a.rate() - 2.0 / 3.0).abs() < 0.01, "{}", a.rate());
        assert_eq!(a.choose(4, 0.35), 2);
        for _ in 0..20 {
            a.record(4, 0);
        }
        assert!(a.rate() < 0.05, "{}", a.rate());
        // A probe, then 2 steps off, a probe, 4 off, a probe...
        let ks: Vec<usize> = (0..10).map(|_| a.choose(4, 0.1)).collect();
        assert_eq!(ks, vec![1, 0, 0, 1, 0, 0, 0, 0, 1, 0]);
        // Acceptance recovers: speculation resumes at once.
        for _ in 0..10 {
            a.record(1, 1);
        }
        assert!(a.choose(4, 0.1) >= 2);
    }
}
