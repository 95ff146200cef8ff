//! Waiting for a decode step without holding a CPU core.
//!
//! `cuStreamSynchronize` spin-waits under the driver's default scheduling, so a batch-1 decode
//! keeps one core busy for the whole step. A replayed decode graph of a given bucket takes about
//! as long as its previous replay, so the host sleeps through most of that time and polls an
//! event only near the end: the step's latency stays the same while the core is free.
//! Other steps (prefill chunks, mixed steps: eager, of unpredictable length) wait on an event
//! created with blocking synchronisation, so the driver puts the host thread to sleep instead of
//! spinning; its wake-up costs tens of microseconds against steps of milliseconds.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaEvent, CudaStream, DriverError, sys};

/// How long before the expected end the host stops sleeping and starts polling.
const MARGIN: Duration = Duration::from_micros(200);

/// The part of the expected duration the host sleeps through: 97% of it, less the margin, so a
/// step that runs faster than the last one costs at most a little latency and the estimate
/// adapts downwards. (90% less 0.4 ms spun 1.4 ms of a 10 ms step: a seventh of a core.)
pub fn sleep_budget(expected: Duration) -> Duration {
    (expected * 97 / 100).saturating_sub(MARGIN)
}

/// Sleeps through most of each decode graph's expected duration, then polls; sleeps through
/// other steps on a blocking event.
pub struct StepWaiter {
    done: CudaEvent,
    blocking: CudaEvent,
    expected: HashMap<usize, Duration>,
}

impl StepWaiter {
    /// Creates the event it polls and the one it blocks on.
    pub fn new(stream: &CudaStream) -> Result<Self, DriverError> {
        let done = stream
            .context()
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))?;
        let blocking = stream
            .context()
            .new_event(Some(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC))?;
        Ok(Self {
            done,
            blocking,
            expected: HashMap::new(),
        })
    }

    /// Waits until the work queued on `stream` is done, asleep in the driver.
    pub fn wait_blocking(&self, stream: &CudaStream) -> Result<(), DriverError> {
        self.blocking.record(stream)?;
        self.blocking.synchronize()
    }

    /// Waits until the work queued on `stream` since `queued` (when the host finished queueing
    /// the step of `bucket`) is done, and remembers how long it took.
    pub fn wait(
        &mut self,
        stream: &CudaStream,
        bucket: usize,
        queued: Instant,
    ) -> Result<(), DriverError> {
        self.done.record(stream)?;
        if let Some(&expected) = self.expected.get(&bucket) {
            let sleep = sleep_budget(expected).saturating_sub(queued.elapsed());
            if !sleep.is_zero() {
                std::thread::sleep(sleep);
            }
        }
        while !self.done.try_is_complete()? {
            std::hint::spin_loop();
        }
        self.expected.insert(bucket, queued.elapsed());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleeps_through_most_of_a_long_step_and_none_of_a_short_one() {
        let ms = Duration::from_millis;
        assert_eq!(sleep_budget(ms(10)), Duration::from_micros(9_700) - MARGIN);
        assert!(sleep_budget(Duration::from_micros(200)).is_zero());
        assert!(sleep_budget(ms(8)) < ms(8));
    }
}
