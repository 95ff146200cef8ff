//! Kernel sources, their model-specific compile-time parameters, and the on-disk module cache.
//!
//! Every kernel family lives in one file under `kernels/` and is embedded in the binary. Before
//! NVRTC compiles a family, the host prepends a block of `#define`s with the model's shapes and
//! the shared prelude, so loop bounds and register arrays are compile-time constants. Compiled
//! modules (cubins for the exact GPU architecture) are cached on disk under a key that covers the
//! family's source, the parameters, the architecture and the NVRTC version.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use ring::digest;

use crate::model::{ExpertKind, MlpDefinition, ModelDefinition, MoeDefinition, Norm, Routing};

/// The prelude prepended to every family (bf16 helpers, warp and block reductions).
const PRELUDE: &str = include_str!("../../../kernels/prelude.cuh");

/// The most alternatives a row may ask for with `logprobs` (the OpenAI API caps `top_logprobs`
/// at 20).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Words per sampled row in the sampling kernel's output (see `kernels/sampling.cu`).
pub const SAMPLE_STRIDE: usize = 2 + 2 * MAX_TOP_LOGPROBS;

/// Parameter words per sampled row in the packed step inputs (see `inputs::pack_step` and
/// `kernels/sampling.cu`).
pub const SAMPLE_PARAMS: usize = 16;

/// One kernel family: a source file and the entry points it defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelFamily {
    /// File name under `kernels/`.
    pub name: &'static str,
    /// The CUDA C++ source.
    pub source: &'static str,
    /// The `extern "C"` kernels the family defines.
    pub entry_points: &'static [&'static str],
}

/// The small-M product kernels, `GEMV_ENTRIES[m - 1]` for m rows of x (see `kernels/gemv.cu`).
pub const GEMV_ENTRIES: [&str; super::plan::GEMV_MAX_M] = [
    "gemv_m1", "gemv_m2", "gemv_m3", "gemv_m4", "gemv_m5", "gemv_m6", "gemv_m7", "gemv_m8",
];

/// The small-M gate/up products that apply SwiGLU to their own result, `[m - 1]` for m rows.
pub const GEMV_SWIGLU_ENTRIES: [&str; super::plan::GEMV_MAX_M] = [
    "gemv_swiglu_m1",
    "gemv_swiglu_m2",
    "gemv_swiglu_m3",
    "gemv_swiglu_m4",
    "gemv_swiglu_m5",
    "gemv_swiglu_m6",
    "gemv_swiglu_m7",
    "gemv_swiglu_m8",
];

/// The small-M q/k/v products that add the bias, rotate q and k and write q, k and v themselves,
/// `[m - 1]` for m rows.
pub const GEMV_QKV_ROPE_ENTRIES: [&str; super::plan::GEMV_MAX_M] = [
    "gemv_qkv_rope_m1",
    "gemv_qkv_rope_m2",
    "gemv_qkv_rope_m3",
    "gemv_qkv_rope_m4",
    "gemv_qkv_rope_m5",
    "gemv_qkv_rope_m6",
    "gemv_qkv_rope_m7",
    "gemv_qkv_rope_m8",
];

/// Every entry point of `kernels/gemv.cu`.
const GEMV_FAMILY_ENTRIES: [&str; 3 * super::plan::GEMV_MAX_M] = {
    let mut all = [""; 3 * super::plan::GEMV_MAX_M];
    let mut i = 0;
    while i < super::plan::GEMV_MAX_M {
        all[i] = GEMV_ENTRIES[i];
        all[super::plan::GEMV_MAX_M + i] = GEMV_SWIGLU_ENTRIES[i];
        all[2 * super::plan::GEMV_MAX_M + i] = GEMV_QKV_ROPE_ENTRIES[i];
        i += 1;
    }
    all
};

/// The FP8 small-M product kernels (see `kernels/fp8.cu`): `FP8_GEMV_ENTRIES[m - 1]` for m rows
/// of x in row groups of 2 weight rows, `[GEMV_MAX_M + m - 1]` in row groups of 4
/// (`fp8::GemvGeometry::entry`).
pub const FP8_GEMV_ENTRIES: [&str; 2 * super::plan::GEMV_MAX_M] = [
    "fp8_gemv_m1",
    "fp8_gemv_m2",
    "fp8_gemv_m3",
    "fp8_gemv_m4",
    "fp8_gemv_m5",
    "fp8_gemv_m6",
    "fp8_gemv_m7",
    "fp8_gemv_m8",
    "fp8_gemv_r4_m1",
    "fp8_gemv_r4_m2",
    "fp8_gemv_r4_m3",
    "fp8_gemv_r4_m4",
    "fp8_gemv_r4_m5",
    "fp8_gemv_r4_m6",
    "fp8_gemv_r4_m7",
    "fp8_gemv_r4_m8",
];

/// The FP8 gate/up products with SwiGLU applied (`kernels/fp8.cu`), `[m - 1]` for m rows of x.
pub const FP8_GEMV_SWIGLU_ENTRIES: [&str; super::plan::GEMV_MAX_M] = [
    "fp8_gemv_swiglu_m1",
    "fp8_gemv_swiglu_m2",
    "fp8_gemv_swiglu_m3",
    "fp8_gemv_swiglu_m4",
    "fp8_gemv_swiglu_m5",
    "fp8_gemv_swiglu_m6",
    "fp8_gemv_swiglu_m7",
    "fp8_gemv_swiglu_m8",
];

/// The FP8 q/k/v products with the rope write applied (`kernels/fp8.cu`), `[m - 1]` for m rows
/// of x.
pub const FP8_GEMV_QKV_ROPE_ENTRIES: [&str; super::plan::GEMV_MAX_M] = [
    "fp8_gemv_qkv_rope_m1",
    "fp8_gemv_qkv_rope_m2",
    "fp8_gemv_qkv_rope_m3",
    "fp8_gemv_qkv_rope_m4",
    "fp8_gemv_qkv_rope_m5",
    "fp8_gemv_qkv_rope_m6",
    "fp8_gemv_qkv_rope_m7",
    "fp8_gemv_qkv_rope_m8",
];

/// Every entry point of `kernels/fp8.cu`.
const FP8_FAMILY_ENTRIES: [&str; 4 * super::plan::GEMV_MAX_M + 5] = {
    let mut all = ["fp8_quantize_input"; 4 * super::plan::GEMV_MAX_M + 5];
    all[1] = "fp8_dequantize_weight";
    all[2] = "fp8_add_rmsnorm";
    all[3] = "fp8_scale_output";
    all[4] = "fp8_swiglu_quantize";
    let mut i = 0;
    while i < 2 * super::plan::GEMV_MAX_M {
        all[5 + i] = FP8_GEMV_ENTRIES[i];
        i += 1;
    }
    let mut m = 0;
    while m < super::plan::GEMV_MAX_M {
        all[5 + 2 * super::plan::GEMV_MAX_M + m] = FP8_GEMV_SWIGLU_ENTRIES[m];
        all[5 + 3 * super::plan::GEMV_MAX_M + m] = FP8_GEMV_QKV_ROPE_ENTRIES[m];
        m += 1;
    }
    all
};

/// The mixture-of-experts kernels (`kernels/moe.cu`, compiled after `kernels/gemv.cu`'s and
/// `kernels/fp8.cu`'s inner loops, and `kernels/moe_fp8.cu`'s FP8 experts after it), compiled
/// only for a model with experts.
pub const MOE_ENTRIES: [&str; 16] = [
    "moe_route",
    "moe_permute",
    "moe_gather",
    "moe_route_permute",
    "moe_gate_up",
    "moe_down",
    "moe_gemm_gate_up",
    "moe_gemm_down",
    "moe_down_combine_one",
    "moe_shared_swiglu",
    "moe_combine",
    "moe_fp8_round",
    "moe_fp8_gate_up",
    "moe_fp8_down",
    "moe_fp8_gemm_gate_up",
    "moe_fp8_gemm_down",
];

/// The attention entry points the forward pass launches: paged, reduce, prefill, small prefill.
pub const ATTENTION_ENTRIES: [&str; 4] = [
    "paged_attention",
    "attention_reduce",
    "prefill_attention",
    "prefill_attention_small",
];

/// The same built without the sliding window, for the full layers of a model whose layers
/// alternate (the `_full` families).
pub const ATTENTION_FULL_ENTRIES: [&str; 4] = [
    "paged_attention_full",
    "attention_reduce_full",
    "prefill_attention_full",
    "prefill_attention_small_full",
];

/// gpt-oss's expert kernels (`kernels/gpt_oss.cu`, compiled after `kernels/moe.cu`'s device
/// code), compiled only for a model with gpt-oss's experts.
pub const GPTOSS_ENTRIES: [&str; 13] = [
    "gptoss_route",
    "gptoss_gate_up",
    "gptoss_gate_up_mxfp4",
    "gptoss_down",
    "gptoss_down_mxfp4",
    "gptoss_combine",
    "gptoss_add_bias",
    "gptoss_permute",
    "gptoss_gather",
    "gptoss_gemm_gate_up",
    "gptoss_gemm_gate_up_mxfp4",
    "gptoss_gemm_down",
    "gptoss_gemm_down_mxfp4",
];

/// Every family the backend compiles when a model loads (`moe.cu` only for a model with
/// experts, `gpt_oss.cu` instead for gpt-oss's, the `_full` attention families only for one whose layers alternate sliding and full
/// attention: [`needed`]).
pub const FAMILIES: [KernelFamily; 15] = [
    KernelFamily {
        name: "embedding.cu",
        source: include_str!("../../../kernels/embedding.cu"),
        entry_points: &["embedding_gather"],
    },
    KernelFamily {
        name: "rmsnorm.cu",
        source: include_str!("../../../kernels/rmsnorm.cu"),
        entry_points: &["add_rmsnorm"],
    },
    KernelFamily {
        name: "qkv_rope.cu",
        source: include_str!("../../../kernels/qkv_rope.cu"),
        entry_points: &["qkv_rope_write", "qkv_rope_write_scaled"],
    },
    KernelFamily {
        name: "attention.cu",
        source: include_str!("../../../kernels/attention.cu"),
        entry_points: &["paged_attention", "attention_reduce"],
    },
    KernelFamily {
        name: "prefill_attention.cu",
        source: include_str!("../../../kernels/prefill_attention.cu"),
        entry_points: &["prefill_attention"],
    },
    KernelFamily {
        name: "prefill_attention_small.cu",
        source: concat!(
            "#define F_SMALL_VARIANT 1\n",
            include_str!("../../../kernels/prefill_attention.cu")
        ),
        entry_points: &["prefill_attention_small"],
    },
    KernelFamily {
        name: "swiglu.cu",
        source: include_str!("../../../kernels/swiglu.cu"),
        entry_points: &["swiglu"],
    },
    KernelFamily {
        name: "sampling.cu",
        source: include_str!("../../../kernels/sampling.cu"),
        entry_points: &["sample_tokens"],
    },
    KernelFamily {
        name: "gemv.cu",
        source: include_str!("../../../kernels/gemv.cu"),
        entry_points: &GEMV_FAMILY_ENTRIES,
    },
    KernelFamily {
        name: "fp8.cu",
        source: include_str!("../../../kernels/fp8.cu"),
        entry_points: &FP8_FAMILY_ENTRIES,
    },
    KernelFamily {
        name: "moe.cu",
        source: concat!(
            "#define GEMV_NO_ENTRIES 1\n#define FP8_NO_ENTRIES 1\n",
            include_str!("../../../kernels/gemv.cu"),
            include_str!("../../../kernels/fp8.cu"),
            include_str!("../../../kernels/moe.cu"),
            include_str!("../../../kernels/moe_fp8.cu")
        ),
        entry_points: &MOE_ENTRIES,
    },
    KernelFamily {
        name: "attention_full.cu",
        source: concat!(
            "#define ATTN_FULL_VARIANT 1\n",
            include_str!("../../../kernels/attention.cu")
        ),
        entry_points: &["paged_attention_full", "attention_reduce_full"],
    },
    KernelFamily {
        name: "prefill_attention_full.cu",
        source: concat!(
            "#define ATTN_FULL_VARIANT 1\n",
            include_str!("../../../kernels/prefill_attention.cu")
        ),
        entry_points: &["prefill_attention_full"],
    },
    KernelFamily {
        name: "prefill_attention_small_full.cu",
        source: concat!(
            "#define ATTN_FULL_VARIANT 1\n#define F_SMALL_VARIANT 1\n",
            include_str!("../../../kernels/prefill_attention.cu")
        ),
        entry_points: &["prefill_attention_small_full"],
    },
    KernelFamily {
        name: "gpt_oss.cu",
        source: concat!(
            "#define GEMV_NO_ENTRIES 1\n#define FP8_NO_ENTRIES 1\n#define MOE_NO_ENTRIES 1\n",
            include_str!("../../../kernels/gemv.cu"),
            include_str!("../../../kernels/fp8.cu"),
            include_str!("../../../kernels/moe.cu"),
            include_str!("../../../kernels/gpt_oss.cu")
        ),
        entry_points: &GPTOSS_ENTRIES,
    },
];

/// Whether a model with kernel parameters `params` needs `family` (the experts' kernels only
/// where there are experts).
pub fn needed(family: &KernelFamily, params: &KernelParams) -> bool {
    if family.name.ends_with("_full.cu") {
        return params.mixed_windows;
    }
    let gpt_oss = params
        .moe
        .is_some_and(|m| matches!(m.experts, ExpertKind::ClampedSwiGlu { .. }));
    match family.name {
        "moe.cu" => params.moe.is_some() && !gpt_oss,
        "gpt_oss.cu" => gpt_oss,
        _ => true,
    }
}

/// The model shapes every kernel is specialised on.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelParams {
    /// Width of the residual stream.
    pub hidden: usize,
    /// Width of one attention head.
    pub head_dim: usize,
    /// Query heads.
    pub num_q_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Vocabulary rows of the LM head.
    pub vocab: usize,
    /// Width of the dense MLPs' gate and up projections (each expert's in a model whose every
    /// layer is sparse: the dense kernels then never run).
    pub intermediate: usize,
    /// Tokens per KV block.
    pub kv_block: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Whether q, k and v carry a bias.
    pub qkv_bias: bool,
    /// Whether q and k get a per-head RMSNorm.
    pub qk_norm: bool,
    /// Sliding-window span (0: none): the sliding layers' where only some layers slide.
    pub sliding_window: usize,
    /// Whether some layers slide and the others attend fully (gpt-oss): the full layers take
    /// the `_full` attention families, built without the window.
    pub mixed_windows: bool,
    /// Whether each query head has an attention sink (`ATTN_SINKS`, gpt-oss).
    pub attn_sinks: bool,
    /// Whether every layer of the definition has the first one's attention and norms, every
    /// dense MLP the same width and every mixture of experts the same shape (the kernels are
    /// compiled for one layer of each kind).
    pub uniform_layers: bool,
    /// The sparse layers' mixture of experts, if any (`kernels/moe.cu`).
    pub moe: Option<MoeDefinition>,
    /// The prefill attention kernel's launch geometry on the target architecture.
    pub flash: super::plan::FlashGeometry,
    /// Whether the target architecture has the small-M products' tensor-core path
    /// (`plan::gemv_tensor_cores`).
    pub gemv_tensor_cores: bool,
    /// Whether the KV cache holds E4M3 bytes (`--kv-cache-dtype fp8`; `KV_FP8`).
    pub kv_fp8: bool,
}

impl KernelParams {
    /// The parameters of the kernels that execute `definition`: its first layer's, which every
    /// layer shares in the architectures declared so far ([`KernelParams::unsupported`] refuses a
    /// definition whose layers differ).
    pub fn from_definition(definition: &ModelDefinition) -> Self {
        let layer = &definition.layers[0];
        let attention = &layer.attention;
        let Norm::Rms { eps } = layer.input_norm;
        let dense = |l: &crate::model::LayerDefinition| match l.mlp {
            MlpDefinition::SwiGlu { intermediate } => Some(intermediate),
            MlpDefinition::Moe(_) => None,
        };
        let sparse = |l: &crate::model::LayerDefinition| match l.mlp {
            MlpDefinition::Moe(moe) => Some(moe),
            MlpDefinition::SwiGlu { .. } => None,
        };
        let moe = definition.layers.iter().find_map(sparse);
        let width = definition.layers.iter().find_map(dense);
        let intermediate = width.or(moe.map(|m| m.expert_intermediate)).unwrap_or(0);
        // The sliding layers' window; a full layer among sliding ones attends like them but
        // for the window (the `_full` families).
        let window = definition
            .layers
            .iter()
            .find_map(|l| l.attention.sliding_window);
        let mixed_windows = window.is_some()
            && definition
                .layers
                .iter()
                .any(|l| l.attention.sliding_window.is_none());
        let windowed = |a: &crate::model::AttentionDefinition| crate::model::AttentionDefinition {
            sliding_window: a.sliding_window.or(window),
            ..a.clone()
        };
        let uniform_layers = definition.layers.iter().all(|l| {
            windowed(&l.attention) == windowed(&layer.attention)
                && l.input_norm == layer.input_norm
                && l.post_attention_norm == layer.post_attention_norm
                && dense(l).is_none_or(|w| Some(w) == width)
                && sparse(l).is_none_or(|m| Some(m) == moe)
        });
        Self {
            hidden: definition.hidden,
            head_dim: attention.head_dim,
            num_q_heads: attention.num_heads,
            num_kv_heads: attention.num_kv_heads,
            vocab: definition.vocab,
            intermediate,
            kv_block: crate::engine::BLOCK_SIZE,
            rms_eps: eps,
            qkv_bias: attention.qkv_bias,
            qk_norm: attention.qk_norm.is_some(),
            sliding_window: window.unwrap_or(0),
            mixed_windows,
            attn_sinks: attention.sinks,
            uniform_layers,
            moe,
            flash: super::plan::flash_geometry(attention.head_dim, ""),
            gemv_tensor_cores: false,
            kv_fp8: false,
        }
    }

    /// The same parameters for kernels compiled for `arch` whose blocks may opt into
    /// `shared_per_block` bytes of shared memory (the prefill attention geometry and the small-M
    /// products' path depend on them).
    pub fn for_device(mut self, arch: &str, shared_per_block: usize) -> Self {
        self.flash = super::plan::flash_geometry(self.head_dim, arch);
        if self.kv_fp8 {
            self.flash = super::plan::SMALL_FLASH;
        }
        self.gemv_tensor_cores = super::plan::gemv_tensor_cores(arch, shared_per_block);
        self
    }

    /// The same parameters with a KV cache of `dtype`: an FP8 cache's prefill attention takes
    /// the `mma.sync` geometry, which widens its tiles to bf16 in shared memory
    /// (`kernels/prefill_attention.cu`). Call before [`KernelParams::for_device`].
    pub fn with_kv_cache(mut self, dtype: crate::engine::KvCacheDtype) -> Self {
        self.kv_fp8 = dtype == crate::engine::KvCacheDtype::Fp8;
        self
    }

    /// Bytes of one cached key or value element.
    pub fn kv_element_bytes(&self) -> usize {
        if self.kv_fp8 { 1 } else { 2 }
    }

    /// The launch geometry of the small-M entries for `m` rows of x.
    pub fn gemv_geometry(&self, m: usize) -> super::plan::GemvGeometry {
        super::plan::gemv_geometry(m, super::plan::gemv_mma_from(self.gemv_tensor_cores))
    }

    /// The `#define` block prepended to every family. Floats are written with `{:e}` so they
    /// round-trip exactly.
    pub fn defines(&self) -> String {
        let mut out = String::new();
        let ints = [
            ("HIDDEN", self.hidden),
            ("HEAD_DIM", self.head_dim),
            ("NUM_Q_HEADS", self.num_q_heads),
            ("NUM_KV_HEADS", self.num_kv_heads),
            ("VOCAB", self.vocab),
            ("INTERMEDIATE", self.intermediate),
            ("KV_BLOCK", self.kv_block),
            ("QKV_BIAS", usize::from(self.qkv_bias)),
            ("QK_NORM", usize::from(self.qk_norm)),
            ("SLIDING_WINDOW", self.sliding_window),
            ("ATTN_SINKS", usize::from(self.attn_sinks)),
            ("MAX_TOP_LOGPROBS", MAX_TOP_LOGPROBS),
            ("SAMPLE_PARAMS", SAMPLE_PARAMS),
            ("ATTN_WARPS", super::plan::ATTN_WARPS),
            ("ATTN_DEPTH", super::plan::ATTN_DEPTH),
            ("ATTN_DEPTH_FP8", super::plan::ATTN_DEPTH_FP8),
            ("ATTN_MIN_PARTITION", super::plan::MIN_PARTITION),
            ("ATTN_REDUCE_THREADS", super::plan::ATTN_REDUCE_THREADS),
            ("ATTN_MERGE_SPLITS", super::plan::ATTN_MERGE_SPLITS),
            ("GEMV_ROWS", super::plan::GEMV_ROWS),
            ("RMS_THREADS", super::plan::RMS_THREADS),
            ("GEMV_WARPS", super::plan::GEMV_WARPS),
            (
                "GEMV_MMA_FROM",
                super::plan::gemv_mma_from(self.gemv_tensor_cores),
            ),
            ("GEMV_MMA_WARPS", super::plan::GEMV_MMA_WARPS),
            ("GEMV_MMA_STAGES", super::plan::GEMV_MMA_STAGES),
            ("F_WGMMA", usize::from(self.flash.wgmma)),
            ("F_ROWS", self.flash.rows),
            ("F_KEYS", self.flash.keys),
            ("F_SHARED", self.flash.shared_bytes),
            ("FS_ROWS", super::plan::SMALL_FLASH.rows),
            ("FS_KEYS", super::plan::SMALL_FLASH.keys),
            ("SWIGLU_VEC", super::plan::swiglu_vector(self.intermediate)),
            ("KV_FP8", usize::from(self.kv_fp8)),
        ];
        let moe = self.moe.map(|m| {
            [
                ("MOE_EXPERTS", m.num_experts),
                ("MOE_TOP_K", m.routing.top_k()),
                ("MOE_RENORMALIZE", usize::from(m.routing.renormalizes())),
                (
                    "MOE_LOGITS",
                    m.num_experts + usize::from(m.shared_expert.is_some()),
                ),
                ("MOE_INTER", m.expert_intermediate),
                ("MOE_SHARED_INTER", m.shared_expert.unwrap_or(0)),
            ]
        });
        for (name, value) in ints.into_iter().chain(moe.into_iter().flatten()) {
            // Writing to a String cannot fail.
            let _ = writeln!(out, "#define {name} {value}");
        }
        if let Some(ExpertKind::ClampedSwiGlu { alpha, limit, .. }) = self.moe.map(|m| m.experts) {
            let _ = writeln!(out, "#define GPTOSS_ALPHA {alpha:e}f");
            let _ = writeln!(out, "#define GPTOSS_LIMIT {limit:e}f");
        }
        let _ = writeln!(out, "#define RMS_EPS {:e}f", self.rms_eps);
        out
    }

    /// Shapes the kernels cannot serve, as a message naming the limit.
    pub fn unsupported(&self) -> Option<String> {
        if let Some(why) = self.moe.and_then(|moe| moe_unsupported(&moe, self.hidden)) {
            return Some(why);
        }
        if !self.uniform_layers {
            return Some("its layers differ from one another".into());
        }
        if self.num_kv_heads == 0 || !self.num_q_heads.is_multiple_of(self.num_kv_heads) {
            return Some(format!(
                "{} query heads are not a multiple of {} KV heads",
                self.num_q_heads, self.num_kv_heads
            ));
        }
        // attention.cu reads key and value rows with 16-byte loads of 8 values.
        if !self.head_dim.is_multiple_of(8) || self.head_dim > 256 {
            return Some(format!(
                "head_dim {} must be a multiple of 8 and at most 256",
                self.head_dim
            ));
        }
        // attention.cu keeps ATTN_WARPS x group x head_dim fp32 partials, and a max and a sum per
        // warp and head, in shared memory.
        let group = self.num_q_heads / self.num_kv_heads;
        let warps = super::plan::ATTN_WARPS;
        let shared = (warps * group * self.head_dim + 2 * warps * group) * 4;
        if shared > 48 * 1024 {
            return Some(format!(
                "attention group {group} x head_dim {} needs {shared} bytes of shared memory",
                self.head_dim
            ));
        }
        None
    }
}

/// Expert shapes `kernels/moe.cu` cannot serve, as a message naming the limit: the grouped
/// products read 16-byte pieces of rows (`hidden` and each expert's width multiples of 8), and
/// their blocks own whole pairs of gate and up rows (the width a multiple of 16).
fn moe_unsupported(moe: &MoeDefinition, hidden: usize) -> Option<String> {
    let gpt_oss = matches!(moe.experts, ExpertKind::ClampedSwiGlu { .. });
    if gpt_oss != matches!(moe.routing, Routing::TopKSoftmax { .. }) {
        return Some("its experts' routing is not their kind's (gpt-oss's experts route top-k then softmax, the others softmax then top-k)".into());
    }
    // kernels/gpt_oss.cu reads rows of x, the experts' rows and the activations 16 bytes at a
    // time.
    if gpt_oss && !(hidden.is_multiple_of(8) && moe.expert_intermediate.is_multiple_of(8)) {
        return Some(format!(
            "hidden size {hidden} and expert width {} must be multiples of 8 for gpt-oss's expert products",
            moe.expert_intermediate
        ));
    }
    if gpt_oss {
        return None;
    }
    if !hidden.is_multiple_of(8) {
        return Some(format!(
            "hidden size {hidden} is not a multiple of 8, which the expert products need"
        ));
    }
    if !moe.expert_intermediate.is_multiple_of(16) {
        return Some(format!(
            "expert width {} (moe_intermediate_size) is not a multiple of 16, which the expert products need",
            moe.expert_intermediate
        ));
    }
    None
}

/// The full source NVRTC compiles for a family.
pub fn full_source(family: &KernelFamily, params: &KernelParams) -> String {
    format!("{}{}{}", params.defines(), PRELUDE, family.source)
}

/// The cache key of a compiled family: SHA-256 over the full source (which embeds the
/// parameters), the architecture and the NVRTC version, in hex.
pub fn cache_key(
    family: &KernelFamily,
    params: &KernelParams,
    arch: &str,
    nvrtc: (i32, i32),
) -> String {
    let mut hasher = digest::Context::new(&digest::SHA256);
    hasher.update(family.name.as_bytes());
    hasher.update(&[0]);
    hasher.update(full_source(family, params).as_bytes());
    hasher.update(&[0]);
    hasher.update(arch.as_bytes());
    hasher.update(&[0]);
    hasher.update(format!("nvrtc {}.{}", nvrtc.0, nvrtc.1).as_bytes());
    hex::encode(hasher.finish())
}

/// Whether NVRTC architecture `arch` (`sm_XY`, `sm_XYa`) converts to and from E4M3, which an FP8
/// KV cache's kernels need: compute capability 8.9 (Ada) and later.
pub fn arch_converts_e4m3(arch: &str) -> bool {
    arch.strip_prefix("sm_")
        .map(|rest| rest.trim_end_matches(|c: char| c.is_ascii_alphabetic()))
        .and_then(|digits| digits.parse::<u32>().ok())
        .is_some_and(|cc| cc >= 89)
}

/// The NVRTC architecture name for a compute capability: Hopper gets `sm_90a`, so the kernels
/// may use its architecture-specific instructions.
pub fn arch_for(major: i32, minor: i32) -> String {
    if (major, minor) == (9, 0) {
        "sm_90a".to_string()
    } else {
        format!("sm_{major}{minor}")
    }
}

/// The directory of the on-disk module cache: `$INFERNO_KERNEL_CACHE`, else
/// `$XDG_CACHE_HOME/inferno/kernels`, else `$HOME/.cache/inferno/kernels`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("INFERNO_KERNEL_CACHE") {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(Path::new(&dir).join("inferno/kernels"));
    }
    std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache/inferno/kernels"))
}

/// Reads a cached module, if present.
pub fn read_cached(dir: &Path, key: &str) -> Option<Vec<u8>> {
    std::fs::read(dir.join(format!("{key}.cubin"))).ok()
}

/// Stores a module in the cache atomically (write to a temporary file, then rename), so a
/// concurrent reader never sees a partial file.
pub fn write_cached(dir: &Path, key: &str, cubin: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!("{key}.cubin.{}.tmp", std::process::id()));
    std::fs::write(&tmp, cubin)?;
    std::fs::rename(&tmp, dir.join(format!("{key}.cubin")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> KernelParams {
        KernelParams {
            hidden: 4096,
            head_dim: 128,
            num_q_heads: 32,
            num_kv_heads: 8,
            vocab: 128_256,
            intermediate: 14_336,
            kv_block: 16,
            rms_eps: 1e-5,
            qkv_bias: false,
            qk_norm: false,
            sliding_window: 0,
            mixed_windows: false,
            attn_sinks: false,
            uniform_layers: true,
            moe: None,
            flash: super::super::plan::flash_geometry(128, ""),
            gemv_tensor_cores: true,
            kv_fp8: false,
        }
    }

    /// An FP8 cache compiles the kernels with `KV_FP8 1`, one byte per element, and the prefill
    /// attention in the `mma.sync` geometry even on Hopper; a bf16 cache keeps the warpgroup one.
    #[test]
    fn an_fp8_cache_selects_its_kernels_and_geometry() {
        use crate::engine::KvCacheDtype;
        let bf16 = params()
            .with_kv_cache(KvCacheDtype::Auto)
            .for_device("sm_90a", 227 * 1024);
        let fp8 = params()
            .with_kv_cache(KvCacheDtype::Fp8)
            .for_device("sm_90a", 227 * 1024);
        assert!(bf16.flash.wgmma);
        assert_eq!(fp8.flash, super::super::plan::SMALL_FLASH);
        assert_eq!((bf16.kv_element_bytes(), fp8.kv_element_bytes()), (2, 1));
        assert!(bf16.defines().contains("#define KV_FP8 0\n"));
        assert!(fp8.defines().contains("#define KV_FP8 1\n"));
        let family = &FAMILIES[3];
        assert_ne!(
            cache_key(family, &bf16, "sm_90a", (13, 0)),
            cache_key(family, &fp8, "sm_90a", (13, 0))
        );
    }

    #[test]
    fn cache_key_changes_with_every_input() {
        let family = &FAMILIES[3];
        let base = cache_key(family, &params(), "sm_90a", (13, 0));
        assert_eq!(base, cache_key(family, &params(), "sm_90a", (13, 0)));
        assert_ne!(base, cache_key(family, &params(), "sm_90", (13, 0)));
        assert_ne!(base, cache_key(family, &params(), "sm_90a", (13, 1)));
        assert_ne!(base, cache_key(&FAMILIES[2], &params(), "sm_90a", (13, 0)));
        let mut other = params();
        other.head_dim = 64;
        assert_ne!(base, cache_key(family, &other, "sm_90a", (13, 0)));
        let mut other = params();
        other.rms_eps = 1e-6;
        assert_ne!(base, cache_key(family, &other, "sm_90a", (13, 0)));
    }

    /// A mixture of experts gets its kernels' parameters (a Qwen3-MoE layer kept dense
    /// included), and expert shapes the grouped products cannot serve are refused in one line,
    /// before anything is compiled or uploaded.
    #[test]
    fn a_mixture_of_experts_gets_its_parameters_and_odd_widths_are_refused() {
        let config = |width: usize| {
            let json = format!(
                r#"{{"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64,
                "intermediate_size": 128, "moe_intermediate_size": {width}, "num_experts": 8,
                "num_experts_per_tok": 2, "norm_topk_prob": true, "mlp_only_layers": [1],
                "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 16, "vocab_size": 100, "max_position_embeddings": 512}}"#
            );
            crate::model::ModelConfig::from_json(Path::new("config.json"), json.as_bytes()).unwrap()
        };
        let p = KernelParams::from_definition(&ModelDefinition::of(&config(32)));
        let moe = p.moe.expect("experts");
        assert_eq!((moe.num_experts, moe.expert_intermediate), (8, 32));
        assert!(p.uniform_layers);
        assert_eq!(p.intermediate, 128, "the dense layer's width");
        assert_eq!(p.unsupported(), None);
        let text = p.defines();
        for needle in [
            "#define MOE_EXPERTS 8\n",
            "#define MOE_TOP_K 2\n",
            "#define MOE_RENORMALIZE 1\n",
            "#define MOE_LOGITS 8\n",
            "#define MOE_INTER 32\n",
            "#define MOE_SHARED_INTER 0\n",
        ] {
            assert!(text.contains(needle), "missing {needle:?}");
        }
        assert!(
            FAMILIES
                .iter()
                .all(|f| needed(f, &p) != (f.name.ends_with("_full.cu") || f.name == "gpt_oss.cu"))
        );
        let refused = KernelParams::from_definition(&ModelDefinition::of(&config(40)))
            .unsupported()
            .unwrap();
        assert!(
            refused.contains("multiple of 16") && !refused.contains('\n'),
            "{refused}"
        );
        let dense = params();
        assert!(!FAMILIES.iter().all(|f| needed(f, &dense)));
        // Qwen2-MoE: the shared expert's gate is a column of the router's product, and every
        // layer is sparse (the dense width is then the experts').
        let json = r#"{"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 64,
            "intermediate_size": 128, "moe_intermediate_size": 32, "num_experts": 8,
            "num_experts_per_tok": 2, "shared_expert_intermediate_size": 48,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 100, "max_position_embeddings": 512}"#;
        let config =
            crate::model::ModelConfig::from_json(Path::new("config.json"), json.as_bytes())
                .unwrap();
        let p = KernelParams::from_definition(&ModelDefinition::of(&config));
        assert_eq!((p.intermediate, p.unsupported()), (32, None));
        let text = p.defines();
        for needle in [
            "#define MOE_LOGITS 9\n",
            "#define MOE_SHARED_INTER 48\n",
            "#define MOE_RENORMALIZE 0\n",
        ] {
            assert!(text.contains(needle), "missing {needle:?}");
        }
    }

    /// The parameters come from the model definition, and a definition whose layers differ (which
    /// the kernels, compiled for one layer, cannot run) is refused in one line.
    #[test]
    fn parameters_follow_the_definition_and_refuse_differing_layers() {
        let json = r#"{"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64,
            "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 100,
            "max_position_embeddings": 512, "rms_norm_eps": 1e-5}"#;
        let config =
            crate::model::ModelConfig::from_json(Path::new("config.json"), json.as_bytes())
                .unwrap();
        let mut definition = ModelDefinition::of(&config);
        let p = KernelParams::from_definition(&definition);
        assert_eq!(
            (p.hidden, p.head_dim, p.num_q_heads, p.num_kv_heads),
            (64, 32, 4, 2)
        );
        assert_eq!((p.intermediate, p.vocab, p.rms_eps), (160, 100, 1e-5));
        assert!(p.qk_norm && !p.qkv_bias && p.uniform_layers);
        assert_eq!(p.unsupported(), None);
        assert!(!p.mixed_windows && !p.attn_sinks);
        assert!(
            FAMILIES
                .iter()
                .all(|f| !f.name.ends_with("_full.cu") || !needed(f, &p))
        );
        // A sliding layer beside a full one: the window is the sliding layer's, and the full
        // layer takes the families built without it.
        definition.layers[1].attention.sliding_window = Some(128);
        let mixed = KernelParams::from_definition(&definition);
        assert_eq!(mixed.unsupported(), None);
        assert!(mixed.mixed_windows && mixed.uniform_layers);
        assert!(mixed.defines().contains("#define SLIDING_WINDOW 128\n"));
        assert!(
            FAMILIES
                .iter()
                .filter(|f| f.name.ends_with("_full.cu"))
                .all(|f| needed(f, &mixed))
        );
        // Two different windows cannot be served.
        definition.layers[0].attention.sliding_window = Some(64);
        let refused = KernelParams::from_definition(&definition)
            .unsupported()
            .unwrap();
        assert!(
            refused.contains("layers differ") && !refused.contains('\n'),
            "{refused}"
        );
    }

    /// gpt-oss: sinks, a sliding layer's window with the `_full` families for the full layers,
    /// q/k/v biases, and its experts' family (with the clamped SwiGLU's constants) instead of
    /// `moe.cu`.
    #[test]
    fn gpt_oss_gets_sinks_windows_and_its_experts_family() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-gpt-oss/config.json");
        let config =
            crate::model::ModelConfig::from_json(&path, &std::fs::read(&path).unwrap()).unwrap();
        let p = KernelParams::from_definition(&ModelDefinition::of(&config));
        assert_eq!(p.unsupported(), None);
        assert!(p.attn_sinks && p.mixed_windows && p.qkv_bias && p.uniform_layers);
        let text = p.defines();
        for needle in [
            "#define SLIDING_WINDOW 8\n",
            "#define ATTN_SINKS 1\n",
            "#define MOE_TOP_K 4\n",
            "#define GPTOSS_ALPHA 1.702e0f\n",
            "#define GPTOSS_LIMIT 7e0f\n",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in {text}");
        }
        for family in FAMILIES {
            assert_eq!(
                needed(&family, &p),
                family.name != "moe.cu",
                "{}",
                family.name
            );
        }
    }

    #[test]
    fn defines_carry_every_shape() {
        let text = params().defines();
        for needle in [
            "#define HIDDEN 4096\n",
            "#define HEAD_DIM 128\n",
            "#define NUM_KV_HEADS 8\n",
            "#define VOCAB 128256\n",
            "#define RMS_EPS 1e-5f\n",
            "#define QK_NORM 0\n",
            "#define ATTN_SINKS 0\n",
            &format!("#define ATTN_WARPS {}\n", super::super::plan::ATTN_WARPS),
            &format!("#define ATTN_DEPTH {}\n", super::super::plan::ATTN_DEPTH),
            &format!(
                "#define ATTN_MIN_PARTITION {}\n",
                super::super::plan::MIN_PARTITION
            ),
            "#define F_WGMMA 0\n",
            "#define F_ROWS 64\n",
            "#define F_KEYS 32\n",
            "#define F_SHARED 0\n",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in {text}");
        }
    }

    /// The prefill geometry for the target architecture reaches the source.
    #[test]
    fn defines_carry_the_architecture_s_prefill_geometry() {
        let text = params().for_device("sm_90a", 227 * 1024).defines();
        for needle in [
            "#define F_WGMMA 1\n",
            "#define F_ROWS 128\n",
            "#define F_KEYS 128\n",
            "#define F_SHARED 230400\n",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in {text}");
        }
    }

    #[test]
    fn every_entry_point_is_defined_in_its_source() {
        for family in FAMILIES {
            for entry in family.entry_points {
                // Defined, or another entry point renamed to it (the small prefill variant).
                assert!(
                    family.source.contains(&format!("{entry}("))
                        || family.source.contains(&format!(" {entry}\n")),
                    "{} lacks {entry}",
                    family.name
                );
            }
        }
    }

    #[test]
    fn hopper_gets_the_arch_specific_target() {
        assert_eq!(arch_for(9, 0), "sm_90a");
        assert_eq!(arch_for(8, 9), "sm_89");
        assert!(arch_converts_e4m3("sm_90a"));
        assert!(arch_converts_e4m3("sm_89"));
        assert!(arch_converts_e4m3("sm_100"));
        assert!(!arch_converts_e4m3("sm_86"));
        assert!(!arch_converts_e4m3("sm_80"));
        assert!(!arch_converts_e4m3("compute_x"));
    }

    #[test]
    fn shapes_beyond_the_kernels_are_refused() {
        assert!(params().unsupported().is_none());
        let mut odd = params();
        odd.num_kv_heads = 5;
        assert!(odd.unsupported().is_some());
        let mut wide = params();
        wide.head_dim = 512;
        assert!(wide.unsupported().is_some());
        let mut unaligned = params();
        unaligned.head_dim = 68;
        assert!(unaligned.unsupported().is_some());
    }

    #[test]
    fn cache_round_trips_atomically() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert!(read_cached(dir.path(), "k").is_none());
        write_cached(dir.path(), "k", b"cubin").expect("write");
        assert_eq!(read_cached(dir.path(), "k").as_deref(), Some(&b"cubin"[..]));
    }
}
