//! Matrix products through cuBLASLt: bf16 inputs, fp32 accumulation, fp32 output (the kernels
//! that consume a product read fp32, so activations are rounded to bf16 only where a GEMM needs
//! bf16 inputs).
//!
//! Every product here is `out[m, n] = x[m, k] · w[n, k]ᵀ` with row-major activations `x` and
//! row-major weights `w` (the safetensors layout). In cuBLASLt's column-major terms that is
//! `outᵀ (n × m) = op(W) · X` with `W` transposed, so no weight is ever re-laid out. The algorithm
//! for each shape comes from cuBLASLt's heuristic once and is cached with its descriptors.
//!
//! cuBLASLt's first choice is not always its fastest on the shapes a step runs (at 256 rows of the
//! 8B model its tiles leave the last wave of SMs part-empty). At start-up the backend therefore
//! times the heuristic's first [`TUNING_CANDIDATES`] algorithms on the model's own weights for
//! each product at a few row counts (`plan::TUNED_ROWS`) and keeps the fastest with
//! [`Gemm::keep_candidate`]. A shape planned later (another row count) starts from the algorithm
//! kept for the nearest tuned row count at or above it (within a factor of two, the last tuned
//! count for larger shapes), when cuBLASLt confirms that algorithm serves the shape
//! (`cublasLtMatmulAlgoCheck`) within the workspace; else from the heuristic's first choice.
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

/// Algorithms of cuBLASLt's heuristic timed per tuned shape at start-up.
pub const TUNING_CANDIDATES: usize = 6;

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
    /// The heuristic's choices for this shape, best first (the first is `algo` unless a tuned
    /// algorithm was taken).
    candidates: Vec<sys::cublasLtMatmulAlgo_t>,
}

/// A cuBLASLt handle, its workspace and the cached plans.
pub struct Gemm {
    handle: sys::cublasLtHandle_t,
    workspace: DeviceBuffer,
    plans: HashMap<Shape, Plan>,
    /// Shapes the small-M kernels computed faster than cuBLASLt at start-up.
    small_m: HashSet<Shape>,
    /// Algorithms measured fastest at start-up, by product (n, k) and row count.
    tuned: HashMap<(usize, usize), Vec<(usize, sys::cublasLtMatmulAlgo_t)>>,
    /// Host time spent planning new shapes.
    planning: Duration,
}

// SAFETY: the handle and descriptors are plain cuBLASLt objects with no thread affinity; the
// backend that owns this value uses them from one thread at a time.
unsafe impl Send for Gemm {}

/// The choice kept for the nearest tuned row count at or above `m` and below `2m`, else for the
/// largest tuned count when it is below `m`.
fn nearest_tuned<T>(tuned: &[(usize, T)], m: usize) -> Option<&T> {
    let above = tuned
        .iter()
        .filter(|(rows, _)| *rows >= m && *rows < 2 * m)
        .min_by_key(|(rows, _)| *rows);
    let beyond = tuned
        .iter()
        .max_by_key(|(rows, _)| *rows)
        .filter(|(rows, _)| *rows < m);
    above.or(beyond).map(|(_, choice)| choice)
}

/// A heuristic result for cuBLASLt to fill in.
fn empty_result() -> sys::cublasLtMatmulHeuristicResult_t {
    // SAFETY: a plain C struct of integers, floats and integer arrays, for which all-zero bits
    // are a valid value.
    unsafe { std::mem::zeroed() }
}

fn lt_err(what: &str) -> impl Fn(lt::CublasError) -> BackendError + '_ {
    move |e| BackendError::Device(format!("cuBLASLt {what}: {e:?}"))
}

impl Gemm {
    /// Creates the handle and its workspace.
    pub fn new() -> Result<Self, BackendError> {
        let handle = lt::create_handle().map_err(lt_err("create"))?;
        Ok(Self {
            handle,
            workspace: DeviceBuffer::new(WORKSPACE_BYTES)?,
            plans: HashMap::new(),
            small_m: HashSet::new(),
            tuned: HashMap::new(),
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

    fn plan(&mut self, shape: Shape) -> Result<&Plan, BackendError> {
        if !self.plans.contains_key(&shape) {
            let started = Instant::now();
            let plan = self.make_plan(shape)?;
            self.planning += started.elapsed();
            self.plans.insert(shape, plan);
        }
        self.plans
            .get(&shape)
            .ok_or_else(|| BackendError::Device("cuBLASLt plan vanished".into()))
    }

    fn make_plan(&self, s: Shape) -> Result<Plan, BackendError> {
        let bf16 = sys::cudaDataType::CUDA_R_16BF;
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
        let a = lt::create_matrix_layout(bf16, s.k as u64, s.n as u64, s.k as i64)
            .map_err(lt_err("layout A"))?;
        let b = lt::create_matrix_layout(bf16, s.k as u64, s.m as u64, s.k as i64)
            .map_err(lt_err("layout B"))?;
        let d = lt::create_matrix_layout(out_type, s.n as u64, s.m as u64, s.n as i64)
            .map_err(lt_err("layout D"))?;
        let pref = lt::create_matmul_pref().map_err(lt_err("preference"))?;
        let ws = WORKSPACE_BYTES as u64;
        // SAFETY: `pref` is live; the workspace limit is a u64 as documented. The layouts and
        // descriptor passed to the heuristic were created above and are live; `results` holds
        // the TUNING_CANDIDATES entries the call may write, and `returned` is a valid i32.
        let heuristic = unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws) as *const u64 as *const c_void,
                std::mem::size_of::<u64>(),
            )
            .map_err(lt_err("workspace preference"))?;
            let mut results = [empty_result(); TUNING_CANDIDATES];
            let mut returned: i32 = 0;
            let status = sys::cublasLtMatmulAlgoGetHeuristic(
                self.handle,
                desc,
                a,
                b,
                d,
                d,
                pref,
                TUNING_CANDIDATES as i32,
                results.as_mut_ptr(),
                &mut returned,
            );
            let _ = lt::destroy_matmul_pref(pref);
            status.result().map(|()| {
                results[..returned.clamp(0, TUNING_CANDIDATES as i32) as usize]
                    .iter()
                    .filter(|r| r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
                    .map(|r| r.algo)
                    .collect::<Vec<_>>()
            })
        }
        .map_err(lt_err("heuristic"))?;
        let Some(&first) = heuristic.first() else {
            return Err(BackendError::Device(format!(
                "cuBLASLt has no algorithm for m={} n={} k={}",
                s.m, s.n, s.k
            )));
        };
        let algo = self
            .tuned_for(s)
            .filter(|tuned| self.serves(desc, (a, b, d), tuned))
            .unwrap_or(first);
        tracing::debug!(m = s.m, n = s.n, k = s.k, "planned cuBLASLt product");
        Ok(Plan {
            desc,
            a,
            b,
            d,
            algo,
            candidates: heuristic,
        })
    }

    /// The algorithm kept at start-up for the nearest tuned row count at or above `s.m` (within
    /// a factor of two), or for the largest tuned count when `s.m` is beyond them all.
    fn tuned_for(&self, s: Shape) -> Option<sys::cublasLtMatmulAlgo_t> {
        nearest_tuned(self.tuned.get(&(s.n, s.k))?, s.m).copied()
    }

    /// Whether cuBLASLt confirms that `algo` computes the product described by `desc` and the
    /// layouts within the workspace.
    fn serves(
        &self,
        desc: sys::cublasLtMatmulDesc_t,
        (a, b, d): (
            sys::cublasLtMatrixLayout_t,
            sys::cublasLtMatrixLayout_t,
            sys::cublasLtMatrixLayout_t,
        ),
        algo: &sys::cublasLtMatmulAlgo_t,
    ) -> bool {
        let mut result = empty_result();
        // SAFETY: the handle, descriptor and layouts are live; `algo` and `result` are valid for
        // the call's reads and writes.
        let status = unsafe {
            sys::cublasLtMatmulAlgoCheck(self.handle, desc, a, b, d, d, algo, &mut result)
        };
        status == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
            && result.workspaceSize <= WORKSPACE_BYTES
    }

    /// Plans `[m, k] x [n, k]^T` and returns how many of cuBLASLt's candidate algorithms
    /// [`Gemm::matmul_candidate`] can time for it.
    pub fn candidates(&mut self, (m, n, k): (usize, usize, usize)) -> Result<usize, BackendError> {
        Ok(self.plan(Shape { m, n, k })?.candidates.len())
    }

    /// Keeps candidate `candidate` of the shape for its own products and as the starting point
    /// of shapes planned later near its row count.
    pub fn keep_candidate(
        &mut self,
        (m, n, k): (usize, usize, usize),
        candidate: usize,
    ) -> Result<(), BackendError> {
        let plan = self.plans.get_mut(&Shape { m, n, k }).ok_or_else(|| {
            BackendError::Device("keeping an algorithm of an unplanned shape".into())
        })?;
        let algo = *plan
            .candidates
            .get(candidate)
            .ok_or_else(|| BackendError::Device(format!("no candidate algorithm {candidate}")))?;
        plan.algo = algo;
        let tuned = self.tuned.entry((n, k)).or_default();
        tuned.retain(|(tuned_m, _)| *tuned_m != m);
        tuned.push((m, algo));
        Ok(())
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
        ptrs: (u64, u64, u64),
        dims: (usize, usize, usize),
    ) -> Result<(), BackendError> {
        self.matmul_candidate(stream, ptrs, dims, None)
    }

    /// [`Gemm::matmul`] by the shape's candidate algorithm `candidate` (see
    /// [`Gemm::candidates`]), or by its kept algorithm when `None`.
    pub fn matmul_candidate(
        &mut self,
        stream: sys::cudaStream_t,
        (x, w, out): (u64, u64, u64),
        (m, n, k): (usize, usize, usize),
        candidate: Option<usize>,
    ) -> Result<(), BackendError> {
        if m == 0 {
            return Ok(());
        }
        let workspace = self.workspace.ptr();
        let handle = self.handle;
        let plan = self.plan(Shape { m, n, k })?;
        let algo = match candidate {
            None => plan.algo,
            Some(i) => *plan.candidates.get(i).ok_or_else(|| {
                BackendError::Device(format!("no candidate algorithm {i} for m={m} n={n} k={k}"))
            })?,
        };
        let alpha: f32 = 1.0;
        let beta: f32 = 0.0;
        // SAFETY: the plan's descriptors are live and match these buffers' shapes and types; the
        // device pointers address allocations of at least the sizes the shapes imply (the
        // backend sizes them from the same model config); alpha and beta are fp32 as the scale
        // type requires; the workspace is WORKSPACE_BYTES long.
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
                &algo,
                workspace as *mut c_void,
                WORKSPACE_BYTES,
                stream,
            )
        }
        .map_err(|e| BackendError::Device(format!("cuBLASLt matmul m={m} n={n} k={k}: {e:?}")))
    }
}

impl Drop for Gemm {
    fn drop(&mut self) {
        for plan in self.plans.values() {
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

#[cfg(test)]
mod tests {
    use super::nearest_tuned;

    #[test]
    fn a_shape_starts_from_the_nearest_tuned_row_count_at_or_above_it() {
        let tuned = [(64, 'a'), (128, 'b'), (256, 'c'), (2048, 'd')];
        assert_eq!(nearest_tuned(&tuned, 128), Some(&'b'), "its own");
        assert_eq!(nearest_tuned(&tuned, 100), Some(&'b'));
        assert_eq!(nearest_tuned(&tuned, 129), Some(&'c'));
        assert_eq!(
            nearest_tuned(&tuned, 40),
            Some(&'a'),
            "64 is below twice 40"
        );
        assert_eq!(nearest_tuned(&tuned, 32), None, "64 is twice 32: too far");
        assert_eq!(nearest_tuned(&tuned, 700), None, "2048 is too far above");
        assert_eq!(nearest_tuned(&tuned, 4096), Some(&'d'), "beyond them all");
        assert_eq!(nearest_tuned::<char>(&[], 256), None);
    }
}
