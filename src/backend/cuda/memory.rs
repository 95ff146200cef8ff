//! Owned device allocations addressed by raw pointers.
//!
//! Kernels and cuBLASLt take raw device addresses; the backend keeps every buffer for its whole
//! life at a fixed address (which CUDA graphs also need), so a plain owned allocation is simpler
//! than cudarc's per-slice event tracking.

use cudarc::driver::result as drv;
use cudarc::driver::sys::CUdeviceptr;

use super::launch::DevicePtr;
use crate::engine::BackendError;

/// A device allocation freed on drop.
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: CUdeviceptr,
    bytes: usize,
}

impl DeviceBuffer {
    /// Allocates `bytes` (at least one byte, so every buffer has a distinct address).
    pub fn new(bytes: usize) -> Result<Self, BackendError> {
        // SAFETY: a plain cuMemAlloc in the current context; the pointer is owned by the returned
        // value and freed exactly once in Drop.
        let ptr = unsafe { drv::malloc_sync(bytes.max(1)) }
            .map_err(|e| BackendError::Device(format!("allocating {bytes} bytes: {e}")))?;
        Ok(Self { ptr, bytes })
    }

    /// Allocates and fills from host bytes.
    pub fn from_bytes(data: &[u8]) -> Result<Self, BackendError> {
        let buf = Self::new(data.len())?;
        buf.write_at(0, data)?;
        Ok(buf)
    }

    /// Copies `data` to byte offset `offset`, synchronously (used at load time only).
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<(), BackendError> {
        if offset + data.len() > self.bytes {
            return Err(BackendError::Device(format!(
                "write of {} bytes at {offset} overflows a buffer of {}",
                data.len(),
                self.bytes
            )));
        }
        // SAFETY: the destination range lies inside this allocation (checked above) and the
        // source is a live host slice.
        unsafe { drv::memcpy_htod_sync(self.ptr + offset as u64, data) }.map_err(|e| {
            BackendError::Device(format!("copying {} bytes to the device: {e}", data.len()))
        })
    }

    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The device address `offset` bytes in.
    pub fn at(&self, offset: usize) -> u64 {
        self.ptr + offset as u64
    }

    /// The device address, as a kernel argument addressing elements of type `T`.
    pub fn device_ptr<T>(&self) -> DevicePtr<T> {
        DevicePtr::new(self.ptr)
    }

    /// The device address `offset` bytes in, as a kernel argument addressing elements of type
    /// `T`.
    pub fn device_ptr_at<T>(&self, offset: usize) -> DevicePtr<T> {
        DevicePtr::new(self.at(offset))
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: the pointer came from cuMemAlloc and is freed only here. Work that used it has
        // finished: the backend synchronises its stream at the end of every step.
        let _ = unsafe { drv::free_sync(self.ptr) };
    }
}
