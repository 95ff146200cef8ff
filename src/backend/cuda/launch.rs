//! Typed kernel launches: device pointers that carry their element type, one argument struct per
//! kernel entry point, and the one place that packs arguments and calls `cuLaunchKernelEx`.
//!
//! Each argument struct's fields are the parameters of its entry point's `extern "C"` signature
//! in `kernels/`, with the same names, in the same order, of the matching types, so a call site
//! names every argument and cannot pass them out of order or of the wrong kind; a [`Kernel`]
//! takes only the arguments of its own entry point. A unit test compares every struct with the
//! signature in the embedded source, so a kernel whose parameters change without its struct
//! fails it.

use std::collections::HashMap;
use std::marker::PhantomData;

use cudarc::driver::sys;
use cudarc::driver::{CudaFunction, CudaStream, DriverError};

use super::compile::KernelError;
use super::kernels::{GEMV_ENTRIES, GEMV_QKV_ROPE_ENTRIES, GEMV_SWIGLU_ENTRIES};
use crate::engine::BackendError;

/// The most parameters any kernel takes (a launch keeps their slots on the stack: a step
/// launches hundreds of kernels).
const MAX_KERNEL_ARGS: usize = 16;

/// One kernel parameter as the driver reads it: 8 bytes, a pointer whole, an `int` or a `float`
/// in the first four.
type Slot = [u8; 8];

/// The type of the elements a device pointer addresses.
pub trait Element {
    /// The pointer's type as the CUDA source spells it (without `const` and `__restrict__`).
    const CUDA_POINTER: &'static str;
}

/// bf16 elements: `bf16` in the kernels (raw 16-bit patterns, `kernels/prelude.cuh`).
#[derive(Debug, Clone, Copy)]
pub enum Bf16 {}

impl Element for Bf16 {
    const CUDA_POINTER: &'static str = "bf16*";
}

/// FP8 E4M3 elements: `e4m3` in the kernels (raw bytes, `kernels/fp8.cu`).
#[derive(Debug, Clone, Copy)]
pub enum E4m3 {}

impl Element for E4m3 {
    const CUDA_POINTER: &'static str = "e4m3*";
}

/// Elements of the KV cache: `kv_t` in the kernels, bf16 or (with an FP8 cache) E4M3 bytes by
/// the `KV_FP8` define (`kernels/prelude.cuh`).
#[derive(Debug, Clone, Copy)]
pub enum Kv {}

impl Element for Kv {
    const CUDA_POINTER: &'static str = "kv_t*";
}

/// MXFP4 blocks: `e2m1x2` in the kernels (bytes of two E2M1 codes, `kernels/gpt_oss.cu`).
#[derive(Debug, Clone, Copy)]
pub enum E2m1x2 {}

impl Element for E2m1x2 {
    const CUDA_POINTER: &'static str = "e2m1x2*";
}

/// MXFP4 scales: `e8m0` in the kernels (power-of-two exponent bytes, `kernels/gpt_oss.cu`).
#[derive(Debug, Clone, Copy)]
pub enum E8m0 {}

impl Element for E8m0 {
    const CUDA_POINTER: &'static str = "e8m0*";
}

impl Element for f32 {
    const CUDA_POINTER: &'static str = "float*";
}

impl Element for i32 {
    const CUDA_POINTER: &'static str = "int*";
}

/// A device address of elements of type `T`.
#[derive(Debug)]
pub struct DevicePtr<T> {
    addr: u64,
    element: PhantomData<fn() -> T>,
}

impl<T> Clone for DevicePtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for DevicePtr<T> {}

impl<T> DevicePtr<T> {
    /// The device address `addr`, taken to hold elements of type `T`.
    pub fn new(addr: u64) -> Self {
        Self {
            addr,
            element: PhantomData,
        }
    }

    /// The raw device address (for cuBLASLt and alignment checks).
    pub fn addr(self) -> u64 {
        self.addr
    }
}

/// One kernel parameter: its name and its type as the CUDA source spells it (without `const` and
/// `__restrict__`).
pub type Parameter = (&'static str, &'static str);

/// A value a kernel takes in one or more consecutive parameter slots.
pub trait KernelArg: Copy {
    /// The parameters the value fills, in order; an empty name stands for the name of the field
    /// of the argument struct that holds the value.
    const PARAMETERS: &'static [Parameter];

    /// Writes the value's slots at `slots[*at..]` and moves `at` past them.
    fn write_slots(self, slots: &mut [Slot], at: &mut usize);
}

impl<T: Element> KernelArg for DevicePtr<T> {
    const PARAMETERS: &'static [Parameter] = &[("", T::CUDA_POINTER)];

    fn write_slots(self, slots: &mut [Slot], at: &mut usize) {
        put(slots, at, self.addr.to_ne_bytes());
    }
}

/// An optional pointer: `None` is the null pointer, which the kernel takes as "absent" (no bias,
/// no norm, no delta, every row).
impl<T: Element> KernelArg for Option<DevicePtr<T>> {
    const PARAMETERS: &'static [Parameter] = &[("", T::CUDA_POINTER)];

    fn write_slots(self, slots: &mut [Slot], at: &mut usize) {
        put(slots, at, self.map_or(0, DevicePtr::addr).to_ne_bytes());
    }
}

impl KernelArg for i32 {
    const PARAMETERS: &'static [Parameter] = &[("", "int")];

    fn write_slots(self, slots: &mut [Slot], at: &mut usize) {
        put(slots, at, four_byte_slot(self.to_ne_bytes()));
    }
}

impl KernelArg for f32 {
    const PARAMETERS: &'static [Parameter] = &[("", "float")];

    fn write_slots(self, slots: &mut [Slot], at: &mut usize) {
        put(slots, at, four_byte_slot(self.to_ne_bytes()));
    }
}

/// Writes `slot` at `slots[*at]` and moves `at` on.
fn put(slots: &mut [Slot], at: &mut usize, slot: Slot) {
    slots[*at] = slot;
    *at += 1;
}

/// The slot of a four-byte value: its bytes first, then zeros.
fn four_byte_slot(bytes: [u8; 4]) -> Slot {
    let mut slot = [0; 8];
    slot[..4].copy_from_slice(&bytes);
    slot
}

/// Defines a group of parameters that several kernels take in the same run: a struct whose
/// fields are the parameters, in order, each a one-slot value (a pointer or a scalar, not another
/// group), and whose [`KernelArg`] fills one slot per field.
macro_rules! kernel_arg_group {
    (
        $(#[$doc:meta])*
        $name:ident {
            $($(#[$field_doc:meta])* $field:ident: $ty:ty,)*
        }
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy)]
        pub struct $name {
            $($(#[$field_doc])* pub $field: $ty,)*
        }

        impl KernelArg for $name {
            const PARAMETERS: &'static [Parameter] =
                &[$((stringify!($field), <$ty as KernelArg>::PARAMETERS[0].1)),*];

            fn write_slots(self, slots: &mut [Slot], at: &mut usize) {
                $(self.$field.write_slots(slots, at);)*
            }
        }
    };
}

kernel_arg_group! {
    /// The reads both attention kernels begin with, in their order: the step's queries, the
    /// layer's cache, the rows' block tables, and each step token's row and position.
    PagedReads {
        /// The queries, [tokens, q heads, head_dim].
        q: DevicePtr<Bf16>,
        /// The layer's key cache.
        k_cache: DevicePtr<Kv>,
        /// The layer's value cache.
        v_cache: DevicePtr<Kv>,
        /// The layer's k and v scales (read by an FP8 cache's kernels only).
        kv_scales: DevicePtr<f32>,
        /// The layer's per-head attention sinks, fp32 (read by kernels built with sinks only).
        sinks: Option<DevicePtr<f32>>,
        /// The rows' block tables in the packed inputs.
        block_tables: DevicePtr<i32>,
        /// The word holding the block tables' stride.
        max_blocks_word: DevicePtr<i32>,
        /// Each token's row.
        token_row: DevicePtr<i32>,
        /// Each token's position.
        positions: DevicePtr<i32>,
    }
}

kernel_arg_group! {
    /// What both q/k/v epilogues (`qkv_rope_write` and the fused small-M products) take, in
    /// their order: the rotary frequencies, each token's position and cache slot, and where q,
    /// k and v go.
    RopeWrites {
        /// The rotary inverse frequencies, [head_dim / 2].
        inv_freq: DevicePtr<f32>,
        /// Each token's position.
        positions: DevicePtr<i32>,
        /// Each token's cache slot (negative: padding, nothing written).
        slots: DevicePtr<i32>,
        /// The rotated queries, [tokens, q heads, head_dim].
        q_out: DevicePtr<Bf16>,
        /// The layer's key cache.
        k_cache: DevicePtr<Kv>,
        /// The layer's value cache.
        v_cache: DevicePtr<Kv>,
        /// The layer's k and v scales (read by an FP8 cache's kernels only).
        kv_scales: DevicePtr<f32>,
    }
}

/// A kernel's parameters in signature order (at most [`MAX_KERNEL_ARGS`]).
#[derive(Debug, Clone, Copy)]
pub struct Parameters {
    list: [Parameter; MAX_KERNEL_ARGS],
    count: usize,
}

impl Parameters {
    /// No parameters.
    const NONE: Self = Self {
        list: [("", ""); MAX_KERNEL_ARGS],
        count: 0,
    };

    /// These parameters followed by those of the value in field `field` (its unnamed one takes
    /// the field's name); at compile time, a kernel with more than `MAX_KERNEL_ARGS` fails.
    const fn then(mut self, field: &'static str, value: &'static [Parameter]) -> Self {
        let mut i = 0;
        while i < value.len() {
            assert!(
                self.count < MAX_KERNEL_ARGS,
                "a kernel with more parameters than MAX_KERNEL_ARGS"
            );
            let (name, cuda_type) = value[i];
            self.list[self.count] = (if name.is_empty() { field } else { name }, cuda_type);
            self.count += 1;
            i += 1;
        }
        self
    }

    /// The parameters.
    pub fn as_slice(&self) -> &[Parameter] {
        &self.list[..self.count]
    }
}

/// The arguments of one or more kernel entry points that share a signature.
pub trait KernelArgs {
    /// The entry points that take these arguments.
    const ENTRY_POINTS: &'static [&'static str];
    /// Each parameter's name and CUDA type, in signature order.
    const PARAMETERS: Parameters;

    /// The arguments' slots in signature order (the slots after them are unused).
    fn slots(&self) -> [Slot; MAX_KERNEL_ARGS];
}

/// Defines an argument struct per signature: its fields are the parameters (or, for a group such
/// as [`PagedReads`], a run of them), in order, and [`KernelArgs`] packs them in that order and
/// lists their names and types.
macro_rules! kernel_args {
    ($(
        $(#[$doc:meta])*
        $name:ident for $entries:expr => {
            $($(#[$field_doc:meta])* $field:ident: $ty:ty,)*
        }
    )*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, Copy)]
        pub struct $name {
            $($(#[$field_doc])* pub $field: $ty,)*
        }

        impl KernelArgs for $name {
            const ENTRY_POINTS: &'static [&'static str] = $entries;
            const PARAMETERS: Parameters =
                Parameters::NONE$(.then(stringify!($field), <$ty as KernelArg>::PARAMETERS))*;

            fn slots(&self) -> [Slot; MAX_KERNEL_ARGS] {
                let mut slots = [[0; 8]; MAX_KERNEL_ARGS];
                let mut at = 0;
                $(self.$field.write_slots(&mut slots, &mut at);)*
                slots
            }
        }

        // Evaluates the parameter list, and with it its bound, when the crate compiles.
        const _: Parameters = <$name as KernelArgs>::PARAMETERS;
    )*};
}

// gpt-oss's expert kernels' arguments (`kernels/gpt_oss.cu`), declared with the macro above.
mod gpt_oss;
pub use gpt_oss::{
    GptOssAddBias, GptOssCombine, GptOssDown, GptOssDownMxfp4, GptOssGateUp, GptOssGateUpMxfp4,
    GptOssGather, GptOssGemmDown, GptOssGemmDownMxfp4, GptOssGemmGateUp, GptOssGemmGateUpMxfp4,
    GptOssPermute, GptOssRoute,
};

// The mixture-of-experts kernels' arguments (`kernels/moe.cu`), declared with the macro above.
mod moe;
pub use moe::{
    MoeCombine, MoeDown, MoeDownCombineOne, MoeFp8Down, MoeFp8GateUp, MoeFp8GemmDown,
    MoeFp8GemmGateUp, MoeFp8Round, MoeGateUp, MoeGather, MoePermute, MoeRoute, MoeRoutePermute,
    MoeSharedSwiglu,
};

// The FP8 kernels' arguments (`kernels/fp8.cu`), declared with the macro above.
mod fp8;
pub use fp8::{
    Fp8AddRmsnorm, Fp8DequantizeWeight, Fp8Gemv, Fp8GemvQkvRope, Fp8GemvSwiglu, Fp8QuantizeInput,
    Fp8ScaleOutput, Fp8SwigluQuantize, QkvRopeWriteScaled,
};

kernel_args! {
    /// The arguments of `embedding_gather` (`kernels/embedding.cu`).
    EmbeddingGather for &["embedding_gather"] => {
        /// The embedding table, [vocab, hidden].
        table: DevicePtr<Bf16>,
        /// One token id per step token (negative: padding, a zero row).
        tokens: DevicePtr<i32>,
        /// The residual stream the rows are written to, [tokens, hidden].
        residual: DevicePtr<f32>,
    }

    /// The arguments of `add_rmsnorm` (`kernels/rmsnorm.cu`).
    AddRmsnorm for &["add_rmsnorm"] => {
        /// The residual stream, [rows, hidden], to which `delta` is added.
        residual: DevicePtr<f32>,
        /// What is added to the residual stream first (`None`: nothing).
        delta: Option<DevicePtr<f32>>,
        /// The norm's weight, [hidden].
        weight: DevicePtr<Bf16>,
        /// The residual rows to normalise, one per block (`None`: the first ones).
        rows: Option<DevicePtr<i32>>,
        /// The normalised rows, [blocks, hidden].
        out: DevicePtr<Bf16>,
    }

    /// The arguments of `qkv_rope_write` (`kernels/qkv_rope.cu`).
    QkvRopeWrite for &["qkv_rope_write"] => {
        /// The q/k/v product, [tokens, (q heads + 2 kv heads) × head_dim].
        qkv: DevicePtr<f32>,
        /// The q/k/v bias (`None` for models without one).
        bias: Option<DevicePtr<Bf16>>,
        /// The per-head RMSNorm weight of q (`None` for models without one).
        q_norm: Option<DevicePtr<Bf16>>,
        /// The per-head RMSNorm weight of k (`None` for models without one).
        k_norm: Option<DevicePtr<Bf16>>,
        /// The rotary frequencies, positions and slots, and where q, k and v go.
        writes: RopeWrites,
    }

    /// The arguments of `paged_attention` (`kernels/attention.cu`).
    PagedAttention for &["paged_attention", "paged_attention_full"] => {
        /// The queries, the layer's cache, the block tables, rows and positions.
        reads: PagedReads,
        /// The split partial outputs.
        part_acc: DevicePtr<f32>,
        /// The split partial maxima and sums.
        part_ml: DevicePtr<f32>,
        /// Per token and KV head, the blocks that have finished (zero between launches).
        merge_counts: DevicePtr<i32>,
        /// The most split-K partitions per token.
        splits: i32,
        /// The softmax scale.
        scale: f32,
        /// The attention output, [tokens, q heads, head_dim].
        out: DevicePtr<Bf16>,
    }

    /// The arguments of `attention_reduce` (`kernels/attention.cu`).
    AttentionReduce for &["attention_reduce", "attention_reduce_full"] => {
        /// The split partial outputs.
        part_acc: DevicePtr<f32>,
        /// The split partial maxima and sums.
        part_ml: DevicePtr<f32>,
        /// Each token's position.
        positions: DevicePtr<i32>,
        /// The layer's per-head attention sinks, fp32 (read by kernels built with sinks only).
        sinks: Option<DevicePtr<f32>>,
        /// The most split-K partitions per token.
        splits: i32,
        /// 1: merge all `splits` of every token (the prefill kernel's); 0: each token's own
        /// count (the paged kernel's).
        all_splits: i32,
        /// The attention output, [tokens, q heads, head_dim].
        out: DevicePtr<Bf16>,
    }

    /// The arguments of `prefill_attention` and `prefill_attention_small`
    /// (`kernels/prefill_attention.cu`).
    PrefillAttention for &[
        "prefill_attention",
        "prefill_attention_small",
        "prefill_attention_full",
        "prefill_attention_small_full",
    ] => {
        /// The queries, the layer's cache, the block tables, rows and positions.
        reads: PagedReads,
        /// The launch's tiles, (first token, count) pairs.
        tiles: DevicePtr<i32>,
        /// The softmax scale.
        scale: f32,
        /// The split-K partitions per tile.
        splits: i32,
        /// The attention output, [tokens, q heads, head_dim] (one split).
        out: DevicePtr<Bf16>,
        /// The split partial outputs (more than one split).
        part_acc: DevicePtr<f32>,
        /// The split partial maxima and sums (more than one split).
        part_ml: DevicePtr<f32>,
    }

    /// The arguments of `swiglu` (`kernels/swiglu.cu`).
    Swiglu for &["swiglu"] => {
        /// The gate/up product, [tokens, 2 × intermediate], the gate half first.
        gate_up: DevicePtr<f32>,
        /// `silu(gate) × up`, [tokens, intermediate].
        out: DevicePtr<Bf16>,
    }

    /// The arguments of `sample_tokens` (`kernels/sampling.cu`).
    SampleTokens for &["sample_tokens"] => {
        /// The sampled rows' logits, [rows, vocab].
        logits: DevicePtr<f32>,
        /// Working space of the same shape.
        scratch: DevicePtr<f32>,
        /// Each row's count of alternatives with logprobs.
        top_n: DevicePtr<i32>,
        /// Each row's sampling parameters.
        params: DevicePtr<i32>,
        /// The penalty, bias and mask lists.
        lists: DevicePtr<i32>,
        /// The sampled tokens, logprobs and alternatives, per row.
        out: DevicePtr<i32>,
    }

    /// The arguments of `gemv_m1` … `gemv_m8` (`kernels/gemv.cu`): `out = x · wᵀ`.
    Gemv for &GEMV_ENTRIES => {
        /// The rows of x, [m, k].
        x: DevicePtr<Bf16>,
        /// The weights, [n, k].
        w: DevicePtr<Bf16>,
        /// The product, [m, n].
        out: DevicePtr<f32>,
        /// Weight rows.
        n: i32,
        /// The product's depth.
        k: i32,
    }

    /// The arguments of `gemv_swiglu_m1` … `_m8` (`kernels/gemv.cu`): the gate/up product with
    /// SwiGLU applied.
    GemvSwiglu for &GEMV_SWIGLU_ENTRIES => {
        /// The rows of x, [m, k].
        x: DevicePtr<Bf16>,
        /// The stacked gate and up weights, [2 × intermediate, k].
        w: DevicePtr<Bf16>,
        /// `silu(gate) × up`, [m, intermediate].
        out: DevicePtr<Bf16>,
        /// The product's depth.
        k: i32,
    }

    /// The arguments of `gemv_qkv_rope_m1` … `_m8` (`kernels/gemv.cu`): the q/k/v product with
    /// the bias, the rotary embedding and the writes of q and the cache slots applied.
    GemvQkvRope for &GEMV_QKV_ROPE_ENTRIES => {
        /// The rows of x, [m, k].
        x: DevicePtr<Bf16>,
        /// The stacked q, k and v weights.
        w: DevicePtr<Bf16>,
        /// The q/k/v bias (`None` for models without one).
        bias: Option<DevicePtr<Bf16>>,
        /// The rotary frequencies, positions and slots, and where q, k and v go.
        writes: RopeWrites,
        /// The product's depth.
        k: i32,
    }
}

/// A launch's grid, threads per block and dynamic shared memory per block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchShape {
    /// Blocks in x, y and z.
    pub grid: (u32, u32, u32),
    /// Threads per block (one-dimensional blocks).
    pub block: u32,
    /// Dynamic shared memory per block, in bytes.
    pub shared_bytes: u32,
}

impl LaunchShape {
    /// `grid` blocks of `block` threads without dynamic shared memory.
    pub fn new(grid: (u32, u32, u32), block: u32) -> Self {
        Self {
            grid,
            block,
            shared_bytes: 0,
        }
    }

    /// The same launch with `shared_bytes` of dynamic shared memory per block (the kernel opted
    /// in at load where that is above 48 KiB).
    pub fn with_shared(self, shared_bytes: u32) -> Self {
        Self {
            shared_bytes,
            ..self
        }
    }
}

/// A loaded kernel entry point that takes the arguments `A`.
pub struct Kernel<A> {
    function: CudaFunction,
    args: PhantomData<fn(A)>,
}

impl<A: KernelArgs> Kernel<A> {
    /// Takes entry point `entry` out of the loaded `functions`; it must be one of those that take
    /// `A` (`A::ENTRY_POINTS`).
    pub fn take(
        functions: &mut HashMap<&'static str, CudaFunction>,
        entry: &'static str,
    ) -> Result<Self, KernelError> {
        let error = |message: String| KernelError::Load {
            kernel: entry.to_string(),
            message,
        };
        if !A::ENTRY_POINTS.contains(&entry) {
            return Err(error(format!(
                "takes none of the arguments {} launches with",
                std::any::type_name::<A>()
            )));
        }
        let function = functions
            .remove(entry)
            .ok_or_else(|| error("entry point missing".into()))?;
        Ok(Self {
            function,
            args: PhantomData,
        })
    }

    /// Lets the kernel's blocks use up to `bytes` of dynamic shared memory (above the default
    /// 48 KiB a kernel must opt in).
    pub fn allow_dynamic_shared(&self, bytes: usize) -> Result<(), DriverError> {
        self.function.set_attribute(
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            i32::try_from(bytes).unwrap_or(i32::MAX),
        )
    }

    /// How many blocks of `threads` threads (without dynamic shared memory) can be resident on
    /// one SM at once.
    pub fn max_active_blocks_per_sm(&self, threads: u32) -> Result<u32, DriverError> {
        self.function
            .occupancy_max_active_blocks_per_multiprocessor(threads, 0, None)
    }

    /// Queues the kernel on `stream` in `shape` with `args`. With `programmatic`, the kernel may
    /// be scheduled while the previous kernel in the stream finishes: every kernel waits on the
    /// device (`await_previous_kernels` in `kernels/prelude.cuh`) before it reads what an
    /// earlier one wrote.
    ///
    /// The function must come from a module loaded in the stream's context, and every pointer in
    /// `args` must address a buffer large enough for the launch (the backend sizes its buffers
    /// for the step limits that `inputs::pack_step` enforces, which also validates every index a
    /// kernel follows).
    pub fn launch(
        &self,
        stream: &CudaStream,
        programmatic: bool,
        shape: LaunchShape,
        args: &A,
    ) -> Result<(), BackendError> {
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| BackendError::Device(format!("binding the CUDA context: {e}")))?;
        let mut slots = args.slots();
        let mut params = [std::ptr::null_mut::<std::ffi::c_void>(); MAX_KERNEL_ARGS];
        let count = A::PARAMETERS.as_slice().len();
        for (param, slot) in params.iter_mut().zip(&mut slots[..count]) {
            *param = slot.as_mut_ptr().cast();
        }
        let mut attribute = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value: sys::CUlaunchAttributeValue {
                programmaticStreamSerializationAllowed: 1,
            },
        };
        let config = sys::CUlaunchConfig {
            gridDimX: shape.grid.0,
            gridDimY: shape.grid.1,
            gridDimZ: shape.grid.2,
            blockDimX: shape.block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: shape.shared_bytes,
            hStream: stream.cu_stream(),
            attrs: &mut attribute,
            numAttrs: u32::from(programmatic),
        };
        // SAFETY: the stream's context is current (bound above), and the function is live (this
        // value holds it) and was loaded in that context (the caller's contract above). The
        // kernel is one of `A::ENTRY_POINTS` (`Kernel::take` admits no other), whose parameter
        // list is `A`'s fields in order and type (`launchers_match_kernel_signatures` checks
        // that against the source): pointers are 64-bit device addresses, ints i32, floats f32,
        // and `params` points at one slot per parameter that outlives the call (the driver
        // copies them before it returns). Every pointer addresses a buffer sized for the launch
        // (the caller's contract above). The attribute is read only when `numAttrs` is 1.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                self.function.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(|e| BackendError::Device(format!("kernel launch: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::super::kernels::FAMILIES;
    use super::*;

    /// An argument struct's entry points and parameters.
    type Launcher = (&'static [&'static str], Parameters);

    /// Every argument struct.
    static LAUNCHERS: [Launcher; 47] = [
        launcher::<EmbeddingGather>(),
        launcher::<AddRmsnorm>(),
        launcher::<QkvRopeWrite>(),
        launcher::<PagedAttention>(),
        launcher::<AttentionReduce>(),
        launcher::<PrefillAttention>(),
        launcher::<Swiglu>(),
        launcher::<SampleTokens>(),
        launcher::<Gemv>(),
        launcher::<GemvSwiglu>(),
        launcher::<GemvQkvRope>(),
        launcher::<Fp8QuantizeInput>(),
        launcher::<Fp8Gemv>(),
        launcher::<Fp8GemvSwiglu>(),
        launcher::<Fp8GemvQkvRope>(),
        launcher::<QkvRopeWriteScaled>(),
        launcher::<Fp8DequantizeWeight>(),
        launcher::<Fp8AddRmsnorm>(),
        launcher::<Fp8SwigluQuantize>(),
        launcher::<Fp8ScaleOutput>(),
        launcher::<MoeRoute>(),
        launcher::<MoePermute>(),
        launcher::<MoeGather>(),
        launcher::<MoeRoutePermute>(),
        launcher::<MoeGateUp>(),
        launcher::<MoeDown>(),
        launcher::<MoeDownCombineOne>(),
        launcher::<MoeSharedSwiglu>(),
        launcher::<MoeCombine>(),
        launcher::<MoeFp8Round>(),
        launcher::<MoeFp8GateUp>(),
        launcher::<MoeFp8Down>(),
        launcher::<MoeFp8GemmGateUp>(),
        launcher::<MoeFp8GemmDown>(),
        launcher::<GptOssRoute>(),
        launcher::<GptOssGateUp>(),
        launcher::<GptOssGateUpMxfp4>(),
        launcher::<GptOssDown>(),
        launcher::<GptOssDownMxfp4>(),
        launcher::<GptOssCombine>(),
        launcher::<GptOssAddBias>(),
        launcher::<GptOssPermute>(),
        launcher::<GptOssGather>(),
        launcher::<GptOssGemmGateUp>(),
        launcher::<GptOssGemmGateUpMxfp4>(),
        launcher::<GptOssGemmDown>(),
        launcher::<GptOssGemmDownMxfp4>(),
    ];

    const fn launcher<A: KernelArgs>() -> Launcher {
        (A::ENTRY_POINTS, A::PARAMETERS)
    }

    /// The parameters (name, type without `const` and `__restrict__`) of `entry`'s definition in
    /// `source`: `name(params) {`, where `name` is `entry` or a macro renamed to it, and
    /// `params` may be a macro.
    fn signature(source: &str, entry: &str) -> Vec<(String, String)> {
        let renamed = source.lines().find_map(|line| {
            line.strip_prefix("#define ")?
                .strip_suffix(&format!(" {entry}"))
        });
        let name = renamed.unwrap_or(entry);
        let opening = format!("{name}(");
        let definitions: Vec<&str> = source
            .match_indices(&opening)
            .filter(|&(at, _)| source[..at].ends_with([' ', '\n']))
            .filter_map(|(at, _)| {
                let rest = &source[at + opening.len()..];
                let close = rest.find(')')?;
                rest[close + 1..]
                    .trim_start()
                    .starts_with('{')
                    .then_some(&rest[..close])
            })
            .collect();
        assert_eq!(definitions.len(), 1, "{entry}: {definitions:?}");
        let mut params = definitions[0]
            .lines()
            .map(|line| line.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join(" ");
        let is_macro = params
            .trim()
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_');
        if is_macro {
            params = macro_body(source, params.trim()).expect("the parameter macro's definition");
        }
        params
            .split(',')
            .map(|param| {
                let spaced = param.replace('*', " * ");
                let mut words: Vec<&str> = spaced
                    .split_whitespace()
                    .filter(|word| !matches!(*word, "const" | "__restrict__"))
                    .collect();
                let name = words.pop().expect("a parameter name").to_string();
                (name, words.concat())
            })
            .collect()
    }

    /// The body of `#define name ...` in `source` (continuation lines joined), if there is one.
    fn macro_body(source: &str, name: &str) -> Option<String> {
        let mut lines = source.lines();
        let first = lines.find_map(|line| line.strip_prefix(&format!("#define {name} ")))?;
        let mut body = String::new();
        let mut line = first;
        loop {
            match line.trim_end().strip_suffix('\\') {
                Some(continued) => {
                    body.push_str(continued);
                    line = lines.next()?;
                }
                None => {
                    body.push_str(line);
                    return Some(body);
                }
            }
        }
    }

    /// Every argument struct's fields are its entry points' parameters: same names, same
    /// order, same types.
    #[test]
    fn launchers_match_kernel_signatures() {
        for (entries, parameters) in &LAUNCHERS {
            let expected: Vec<(String, String)> = parameters
                .as_slice()
                .iter()
                .map(|&(name, ty)| (name.to_string(), ty.to_string()))
                .collect();
            for entry in entries.iter() {
                let family = FAMILIES
                    .iter()
                    .find(|family| family.entry_points.contains(entry))
                    .unwrap_or_else(|| panic!("no family defines {entry}"));
                assert_eq!(
                    signature(family.source, entry),
                    expected,
                    "{entry} in {}",
                    family.name
                );
            }
        }
    }

    /// Every entry point the backend compiles has exactly one argument struct.
    #[test]
    fn every_entry_point_has_one_launcher() {
        for family in FAMILIES {
            for entry in family.entry_points {
                let launchers = LAUNCHERS
                    .iter()
                    .filter(|(entries, _)| entries.contains(entry))
                    .count();
                assert_eq!(launchers, 1, "{entry} has {launchers} launchers");
            }
        }
    }

    /// The slots hold the fields in declaration order: pointers whole, ints and floats in the
    /// first four bytes, absent pointers null.
    #[test]
    fn slots_follow_the_field_order() {
        let args = AddRmsnorm {
            residual: DevicePtr::new(0x1000),
            delta: None,
            weight: DevicePtr::new(0x2000),
            rows: Some(DevicePtr::new(0x3000)),
            out: DevicePtr::new(0x4000),
        };
        let words: Vec<u64> = args
            .slots()
            .iter()
            .map(|slot| u64::from_ne_bytes(*slot))
            .collect();
        assert_eq!(&words[..6], &[0x1000, 0, 0x2000, 0x3000, 0x4000, 0]);
        let reduce = AttentionReduce {
            part_acc: DevicePtr::new(8),
            part_ml: DevicePtr::new(16),
            positions: DevicePtr::new(24),
            sinks: None,
            splits: -3,
            all_splits: 1,
            out: DevicePtr::new(32),
        };
        let splits = reduce.slots()[4];
        assert_eq!(splits[..4], (-3i32).to_ne_bytes());
        assert_eq!(splits[4..], [0; 4]);
        let attention = PagedAttention {
            reads: PagedReads {
                q: DevicePtr::new(1),
                k_cache: DevicePtr::new(2),
                v_cache: DevicePtr::new(3),
                kv_scales: DevicePtr::new(4),
                sinks: Some(DevicePtr::new(5)),
                block_tables: DevicePtr::new(6),
                max_blocks_word: DevicePtr::new(7),
                token_row: DevicePtr::new(8),
                positions: DevicePtr::new(9),
            },
            part_acc: DevicePtr::new(10),
            part_ml: DevicePtr::new(11),
            merge_counts: DevicePtr::new(12),
            splits: 2,
            scale: 0.125,
            out: DevicePtr::new(15),
        }
        .slots();
        let pointers: Vec<u64> = attention[..12]
            .iter()
            .map(|slot| u64::from_ne_bytes(*slot))
            .collect();
        assert_eq!(pointers, (1..=12).collect::<Vec<u64>>());
        assert_eq!(attention[13][..4], 0.125f32.to_ne_bytes());
        assert_eq!(attention[13][4..], [0; 4]);
        assert_eq!(u64::from_ne_bytes(attention[14]), 15);
    }
}
