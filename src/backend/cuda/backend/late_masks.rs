//! Late grammar masks copied beside the forward pass.
//!
//! A started step's late masks (`docs/cuda-backend.md`, "Started steps and late grammar masks")
//! are known once the engine has collected them, while the forward pass runs. Copied on the
//! step's own stream, their copy would queue behind the forward pass and hold the sampler back
//! (64 masks over a 151,936-token vocabulary are 1.2 MB, from pageable memory); copied on a
//! second stream, it runs while the forward pass does, and the step's stream waits only for its
//! end before it samples. The copy also waits for the step's first copy of its inputs, which
//! writes the same buffer.

use std::sync::Arc;

use cudarc::driver::result as drv;
use cudarc::driver::{CudaEvent, CudaStream, DriverError, sys};

/// The second stream and the events that order it against the step's stream.
pub(super) struct LateMaskCopy {
    stream: Arc<CudaStream>,
    /// Recorded on the step's stream after the step's first copy of its inputs.
    inputs_copied: CudaEvent,
    /// Recorded on the second stream after the late masks' copy.
    masks_copied: CudaEvent,
}

impl LateMaskCopy {
    /// Creates the second stream and its events in `main`'s context.
    pub(super) fn new(main: &CudaStream) -> Result<Self, DriverError> {
        let ctx = main.context();
        let flags = Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        Ok(Self {
            stream: ctx.new_stream()?,
            inputs_copied: ctx.new_event(flags)?,
            masks_copied: ctx.new_event(flags)?,
        })
    }

    /// Marks the end of a step's first copy of its inputs, queued on `main`: the late masks'
    /// copy starts after it.
    pub(super) fn inputs_queued(&self, main: &CudaStream) -> Result<(), DriverError> {
        self.inputs_copied.record(main)
    }

    /// Copies `source` to `dst` on the second stream once the step's first copy is done, and
    /// makes `main` wait for it before anything queued on it next (the sampler).
    ///
    /// # Safety
    /// `dst` addresses at least `source.len()` words of device memory that nothing queued on
    /// `main` since [`LateMaskCopy::inputs_queued`] reads or writes before the sampler; `source`
    /// stays alive and unmodified until `main` is synchronised.
    pub(super) unsafe fn copy(
        &self,
        main: &CudaStream,
        dst: sys::CUdeviceptr,
        source: &[i32],
    ) -> Result<(), DriverError> {
        self.stream.wait(&self.inputs_copied)?;
        // SAFETY: the caller's contract: `dst` holds `source`, no kernel touches it until
        // `main` has waited for `masks_copied`, and `source` outlives the copy.
        unsafe { drv::memcpy_htod_async(dst, source, self.stream.cu_stream()) }?;
        self.masks_copied.record(&self.stream)?;
        main.wait(&self.masks_copied)
    }
}
