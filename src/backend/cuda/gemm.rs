//! Matrix products through cuBLASLt: bf16 inputs, fp32 accumulation, fp32 output (the kernels
//! that consume a product read fp32, so activations are rounded to bf16 only where a GEMM needs
//! bf16 inputs).
//!
//! Every product here is `out[m, n] = x[m, k] · w[n, k]ᵀ` with row-major activations `x` and
//! row-major weights `w` (the safetensors layout). In cuBLASLt's column-major terms that is
//! `outᵀ (n × m) = op(W) · X` with `W` transposed, so no weight is ever re-laid out. The algorithm
//! for each shape comes from cuBLASLt's heuristic once and is cached with its descriptors; for
//! bf16 shapes up to [`MAX_CANDIDATES`] of the heuristic's results are kept, and start-up may
//! time them on the model's step row counts and pick the fastest ([`Gemm::use_algorithm`]).
//!
//! FP8 products (`Gemm::matmul_fp8`) multiply E4M3 weights and inputs unscaled, fp32 out; the
//! caller applies the per-row and per-token scales (cuBLASLt 13 on an H100 refused outer-vector
//! scale modes with fp32 output: `CUBLAS_STATUS_INVALID_VALUE`).
//!
//! Products of at most `plan::GEMV_MAX_M` rows may instead run the small-M kernels of
//! `kernels/gemv.cu`; which path serves each such shape is measured once at start-up (the backend
//! times both on the model's own weights) and recorded here with [`Gemm::record_small_m`].

use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::time::{Duration, Instant};

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;

use crate::engine::BackendError;

use super::memory::DeviceBuffer;

/// Workspace cuBLASLt may use per product.
const WORKSPACE_BYTES: usize = 32 << 20;

/// The most of cuBLASLt's heuristic results kept per bf16 shape as candidates that start-up may
/// time (`Gemm::use_algorithm`); the first is the heuristic's own choice.
pub const MAX_CANDIDATES: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Shape {
    m: usize,
    n: usize,
    k: usize,
}

struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
    /// The heuristic's results, best first (`algo` is one of them).
    candidates: Vec<sys::cublasLtMatmulAlgo_t>,
}

/// A cuBLASLt handle, its workspace and the cached plans.
pub struct Gemm {
    handle: sys::cublasLtHandle_t,
    workspace: DeviceBuffer,
    plans: HashMap<Shape, Plan>,
    /// The FP8 products' plans.
    fp8_plans: HashMap<Shape, Plan>,
    /// Shapes the small-M kernels computed faster than cuBLASLt at start-up.
    small_m: HashSet<Shape>,
    /// Host time spent planning new shapes.
    planning: Duration,
}

// SAFETY: the handle and descriptors are plain cuBLASLt objects with no thread affinity; the
// backend that owns this value uses them from one thread at a time.
unsafe impl Send for Gemm {}

fn lt_err(what: &str) -> impl Fn(lt::CublasError) -> BackendError + '_ {
    move |e| BackendError::Device(format!("cuBLASLt {what}: {e:?}"))
}

impl Gemm {
    /// The cuBLASLt library's version (`cublasLtGetVersion`).
    pub fn library_version() -> usize {
        // SAFETY: takes no arguments and only reads the loaded library's version constant.
        unsafe { sys::cublasLtGetVersion() }
    }

    /// Creates the handle and its workspace.
    pub fn new() -> Result<Self, BackendError> {
        let handle = lt::create_handle().map_err(lt_err("create"))?;
        Ok(Self {
            handle,
            workspace: DeviceBuffer::new(WORKSPACE_BYTES)?,
            plans: HashMap::new(),
            fp8_plans: HashMap::new(),
            small_m: HashSet::new(),
            planning: Duration::ZERO,
        })
    }

    /// Host time spent choosing algorithms for new shapes so far.
    pub fn planning_time(&self) -> Duration {
        self.planning
    }

    /// Number of shapes planned so far.
    pub fn planned_shapes(&self) -> usize {
        self.plans.len()
    }

    fn plan(&mut self, shape: Shape, fp8: bool) -> Result<&Plan, BackendError> {
        let cached = if fp8 {
            self.fp8_plans.contains_key(&shape)
        } else {
            self.plans.contains_key(&shape)
        };
        if !cached {
            let started = Instant::now();
            let plan = self.make_plan(shape, fp8)?;
            self.planning += started.elapsed();
            if fp8 {
                self.fp8_plans.insert(shape, plan);
            } else {
                self.plans.insert(shape, plan);
            }
        }
        let plans = if fp8 { &self.fp8_plans } else { &self.plans };
        plans
            .get(&shape)
            .ok_or_else(|| BackendError::Device("cuBLASLt plan vanished".into()))
    }

    fn make_plan(&self, s: Shape, fp8: bool) -> Result<Plan, BackendError> {
        let bf16 = if fp8 {
            sys::cudaDataType::CUDA_R_8F_E4M3
        } else {
            sys::cudaDataType::CUDA_R_16BF
        };
        let out_type = sys::cudaDataType::CUDA_R_32F;
        let desc = lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType::CUDA_R_32F,
        )
        .map_err(lt_err("matmul desc"))?;
        let transpose: i32 = 1;
        // SAFETY: `desc` is live; the attribute value is an i32 as cuBLASLt documents for TRANSA.
        unsafe {
            lt::set_matmul_desc_attribute(
                desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                (&transpose) as *const i32 as *const c_void,
                std::mem::size_of::<i32>(),
            )
        }
        .map_err(lt_err("transpose"))?;
        if fp8 {
            // E4M3 products accumulate without periodic promotion (fast accumulation), as
            // inference FP8 GEMMs commonly run: its error is far below E4M3's own rounding of
            // the inputs, and cuBLASLt documents it as the faster mode (`scripts/fp8-check.cu`'s
            // gemm mode times both).
            let fast: i8 = 1;
            // SAFETY: `desc` is live; cuBLASLt documents FAST_ACCUM's value as an int8_t.
            unsafe {
                lt::set_matmul_desc_attribute(
                    desc,
                    sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                    (&fast) as *const i8 as *const c_void,
                    std::mem::size_of::<i8>(),
                )
            }
            .map_err(lt_err("fast accumulation"))?;
        }
        let a = lt::create_matrix_layout(bf16, s.k as u64, s.n as u64, s.k as i64)
            .map_err(lt_err("layout A"))?;
        let b = lt::create_matrix_layout(bf16, s.k as u64, s.m as u64, s.k as i64)
            .map_err(lt_err("layout B"))?;
        let d = lt::create_matrix_layout(out_type, s.n as u64, s.m as u64, s.n as i64)
            .map_err(lt_err("layout D"))?;
        let pref = lt::create_matmul_pref().map_err(lt_err("preference"))?;
        let ws = WORKSPACE_BYTES as u64;
        let wanted = if fp8 { 1 } else { MAX_CANDIDATES };
        // SAFETY: the heuristic results are plain C structs for which all-zero bytes are valid.
        let mut results: Vec<sys::cublasLtMatmulHeuristicResult_t> =
            vec![unsafe { std::mem::zeroed() }; wanted];
        let mut returned: i32 = 0;
        // SAFETY: `pref` is live; the workspace limit is a u64 as documented. The layouts and
        // descriptor passed to the heuristic were created above and are live; `results` has room
        // for the `wanted` results asked for and `returned` receives their count.
        let status = unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws) as *const u64 as *const c_void,
                std::mem::size_of::<u64>(),
            )
            .map_err(lt_err("workspace preference"))?;
            let status = sys::cublasLtMatmulAlgoGetHeuristic(
                self.handle,
                desc,
                a,
                b,
                d,
                d,
                pref,
                wanted as i32,
                results.as_mut_ptr(),
                &mut returned,
            );
            let _ = lt::destroy_matmul_pref(pref);
            status
        };
        let returned = if status == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            usize::try_from(returned).unwrap_or(0).min(wanted)
        } else {
            0
        };
        let candidates: Vec<sys::cublasLtMatmulAlgo_t> = results
            .iter()
            .take(returned)
            .filter(|r| r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
            .map(|r| r.algo)
            .collect();
        let Some(&algo) = candidates.first() else {
            return Err(BackendError::Device(format!(
                "cuBLASLt has no algorithm for m={} n={} k={}: {status:?}",
                s.m, s.n, s.k
            )));
        };
        tracing::debug!(m = s.m, n = s.n, k = s.k, fp8, "planned cuBLASLt product");
        Ok(Plan {
            desc,
            a,
            b,
            d,
            algo,
            candidates,
        })
    }

    /// How many of cuBLASLt's candidate algorithms (at most [`MAX_CANDIDATES`]) the bf16
    /// product `[m, k] x [n, k]^T` has, planning it if needed.
    pub fn candidates(&mut self, (m, n, k): (usize, usize, usize)) -> Result<usize, BackendError> {
        Ok(self.plan(Shape { m, n, k }, false)?.candidates.len())
    }

    /// Makes candidate `index` (in the heuristic's order) the algorithm of the bf16 product
    /// `[m, k] x [n, k]^T` from now on; false (nothing changed) when the shape is not planned or
    /// has no such candidate.
    pub fn use_algorithm(&mut self, (m, n, k): (usize, usize, usize), index: usize) -> bool {
        match self.plans.get_mut(&Shape { m, n, k }) {
            Some(plan) if index < plan.candidates.len() => {
                plan.algo = plan.candidates[index];
                true
            }
            _ => false,
        }
    }

    /// Records which path serves `[m, k] x [n, k]^T` from now on: the small-M kernel when
    /// `kernel_faster`, else cuBLASLt.
    pub fn record_small_m(&mut self, (m, n, k): (usize, usize, usize), kernel_faster: bool) {
        let shape = Shape { m, n, k };
        if kernel_faster {
            self.small_m.insert(shape);
        } else {
            self.small_m.remove(&shape);
        }
    }

    /// Whether the small-M kernel serves this shape (it was measured faster at start-up).
    pub fn uses_small_m(&self, (m, n, k): (usize, usize, usize)) -> bool {
        self.small_m.contains(&Shape { m, n, k })
    }

    /// Shapes the small-M kernels serve.
    pub fn small_m_shapes(&self) -> usize {
        self.small_m.len()
    }

    /// `out[m, n] = x[m, k] · w[n, k]ᵀ` on `stream`, with `x` and `w` bf16 and `out` fp32.
    /// Pointers are device addresses of buffers of at least those sizes (the caller's contract).
    pub fn matmul(
        &mut self,
        stream: sys::cudaStream_t,
        buffers: (u64, u64, u64),
        shape: (usize, usize, usize),
    ) -> Result<(), BackendError> {
        self.queue(stream, buffers, shape, false)
    }

    /// `out[m, n] = x[m, k] · w[n, k]ᵀ` on `stream`, with `x` and `w` E4M3 codes (unscaled) and
    /// `out` fp32. Pointers are device addresses of buffers of at least those sizes (the caller's
    /// contract). An error (no algorithm for the shape) leaves nothing queued.
    pub fn matmul_fp8(
        &mut self,
        stream: sys::cudaStream_t,
        buffers: (u64, u64, u64),
        shape: (usize, usize, usize),
    ) -> Result<(), BackendError> {
        self.queue(stream, buffers, shape, true)
    }

    /// Queues one product with the plan of its shape and input type (bf16, or E4M3 when `fp8`).
    fn queue(
        &mut self,
        stream: sys::cudaStream_t,
        (x, w, out): (u64, u64, u64),
        (m, n, k): (usize, usize, usize),
        fp8: bool,
    ) -> Result<(), BackendError> {
        if m == 0 {
            return Ok(());
        }
        let workspace = self.workspace.ptr();
        let handle = self.handle;
        let plan = self.plan(Shape { m, n, k }, fp8)?;
        let alpha: f32 = 1.0;
        let beta: f32 = 0.0;
        // SAFETY: the plan's descriptors are live and match these buffers' shapes and types (bf16
        // or E4M3 A and B as `fp8` says, fp32 D); the device pointers address allocations of at
        // least the sizes the shapes imply (the backend sizes them from the same model config);
        // alpha and beta are fp32 as the scale type requires; the workspace is WORKSPACE_BYTES
        // long.
        unsafe {
            lt::matmul(
                handle,
                plan.desc,
                (&alpha) as *const f32 as *const c_void,
                (&beta) as *const f32 as *const c_void,
                w as *const c_void,
                plan.a,
                x as *const c_void,
                plan.b,
                out as *const c_void,
                plan.d,
                out as *mut c_void,
                plan.d,
                &plan.algo,
                workspace as *mut c_void,
                WORKSPACE_BYTES,
                stream,
            )
        }
        .map_err(|e| {
            let kind = if fp8 { "FP8 " } else { "" };
            BackendError::Device(format!("cuBLASLt {kind}matmul m={m} n={n} k={k}: {e:?}"))
        })
    }
}

impl Drop for Gemm {
    fn drop(&mut self) {
        for plan in self.plans.values().chain(self.fp8_plans.values()) {
            // SAFETY: each object was created by this value and is destroyed once.
            unsafe {
                let _ = lt::destroy_matrix_layout(plan.a);
                let _ = lt::destroy_matrix_layout(plan.b);
                let _ = lt::destroy_matrix_layout(plan.d);
                let _ = lt::destroy_matmul_desc(plan.desc);
            }
        }
        // SAFETY: the handle was created by this value and is destroyed once.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}
