//! The mixture-of-experts settings of `config.json` (Qwen3-MoE and Mixtral): how many experts,
//! how many each token uses, how their weights are combined and which layers have them.

use serde_json::Value;

use super::config::Architecture;
use super::error::ModelError;
use super::json::JsonObject;

/// The most experts a layer may have. The GPU routing kernel (`kernels/moe.cu`) keeps a token's
/// router logits in one warp's registers (`docs/engine.md`, "The MoE path"); published models
/// have at most 512 (Qwen3-Next).
pub const MAX_EXPERTS: usize = 512;

/// The most experts a token may use (published models use 2 to 10).
pub const MAX_TOP_K: usize = 16;

/// The experts of a model's sparse layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoeConfig {
    /// Experts per sparse layer (`num_experts`, Mixtral's `num_local_experts`).
    pub num_experts: usize,
    /// Experts each token is routed to (`num_experts_per_tok`).
    pub top_k: usize,
    /// Width of each expert's gate and up projections (`moe_intermediate_size`; Mixtral's
    /// `intermediate_size`).
    pub expert_intermediate: usize,
    /// Whether the top-k routing weights are divided by their sum (`norm_topk_prob`; always for
    /// Mixtral).
    pub renormalize: bool,
    /// Every `sparse_step`-th layer is sparse (`decoder_sparse_step`, 1-based as transformers
    /// counts: layer `i` when `(i + 1) % sparse_step == 0`).
    pub sparse_step: usize,
    /// Layers that keep a dense MLP whatever the step (`mlp_only_layers`).
    pub dense_layers: Vec<usize>,
    /// Width of the shared expert every token uses (`shared_expert_intermediate_size`,
    /// Qwen2-MoE), if any.
    pub shared_expert_intermediate: Option<usize>,
}

impl MoeConfig {
    /// The expert settings of `config` for `architecture`, or `None` for a dense architecture.
    pub(crate) fn from_config(
        architecture: Architecture,
        config: &JsonObject<'_>,
    ) -> Result<Option<Self>, ModelError> {
        let moe = match architecture {
            Architecture::Llama
            | Architecture::Mistral
            | Architecture::Qwen2
            | Architecture::Qwen3 => return Ok(None),
            // transformers' Qwen3MoeConfig defaults: 128 experts, top 8, no renormalisation,
            // every layer sparse. Published configs say `num_experts`; transformers 5 saves it
            // as `num_local_experts`.
            Architecture::Qwen3Moe => Self {
                num_experts: match config.opt_usize("num_experts")? {
                    Some(n) => n,
                    None => config.opt_usize("num_local_experts")?.unwrap_or(128),
                },
                top_k: config.opt_usize("num_experts_per_tok")?.unwrap_or(8),
                expert_intermediate: config.positive("moe_intermediate_size")?,
                renormalize: config.opt_bool("norm_topk_prob")?.unwrap_or(false),
                sparse_step: config.opt_usize("decoder_sparse_step")?.unwrap_or(1),
                dense_layers: layer_list(config, "mlp_only_layers")?,
                shared_expert_intermediate: None,
            },
            // transformers' Qwen2MoeConfig defaults: 60 experts, top 4, no renormalisation, a
            // shared expert of width 5632, every layer sparse.
            Architecture::Qwen2Moe => Self {
                num_experts: config.opt_usize("num_experts")?.unwrap_or(60),
                top_k: config.opt_usize("num_experts_per_tok")?.unwrap_or(4),
                expert_intermediate: config.positive("moe_intermediate_size")?,
                renormalize: config.opt_bool("norm_topk_prob")?.unwrap_or(false),
                sparse_step: config.opt_usize("decoder_sparse_step")?.unwrap_or(1),
                dense_layers: layer_list(config, "mlp_only_layers")?,
                shared_expert_intermediate: Some(
                    config
                        .opt_usize("shared_expert_intermediate_size")?
                        .unwrap_or(5632),
                )
                .filter(|&width| width > 0),
            },
            // gpt-oss: top 4 of `num_local_experts` (transformers' default 128), each expert as
            // wide as `intermediate_size`; the routing is the definition's (`definition.rs`).
            Architecture::GptOss => Self {
                num_experts: config.opt_usize("num_local_experts")?.unwrap_or(128),
                top_k: config.opt_usize("num_experts_per_tok")?.unwrap_or(4),
                expert_intermediate: config.positive("intermediate_size")?,
                renormalize: false,
                sparse_step: 1,
                dense_layers: Vec::new(),
                shared_expert_intermediate: None,
            },
            // Mixtral: 8 experts, top 2, the top-2 weights always renormalised, every layer
            // sparse.
            Architecture::Mixtral => Self {
                num_experts: config.opt_usize("num_local_experts")?.unwrap_or(8),
                top_k: config.opt_usize("num_experts_per_tok")?.unwrap_or(2),
                expert_intermediate: config.positive("intermediate_size")?,
                renormalize: true,
                sparse_step: 1,
                dense_layers: Vec::new(),
                shared_expert_intermediate: None,
            },
        };
        moe.check(architecture, config)?;
        Ok(Some(moe))
    }

    /// Refuses counts the routing cannot serve, naming the field and the limit.
    fn check(&self, architecture: Architecture, config: &JsonObject<'_>) -> Result<(), ModelError> {
        let experts_field = match architecture {
            Architecture::Mixtral | Architecture::GptOss => "num_local_experts",
            _ => "num_experts",
        };
        if self.num_experts == 0 || self.num_experts > MAX_EXPERTS {
            return Err(config.invalid(
                experts_field,
                format!(
                    "{} experts are not supported (1 to {MAX_EXPERTS})",
                    self.num_experts
                ),
            ));
        }
        if self.top_k == 0 || self.top_k > self.num_experts.min(MAX_TOP_K) {
            return Err(config.invalid(
                "num_experts_per_tok",
                format!(
                    "top-{} routing is not supported (1 to {}: at most the {} experts and at most {MAX_TOP_K})",
                    self.top_k,
                    self.num_experts.min(MAX_TOP_K),
                    self.num_experts
                ),
            ));
        }
        if self.sparse_step == 0 {
            return Err(config.invalid("decoder_sparse_step", "must be positive"));
        }
        Ok(())
    }

    /// Whether layer `index` (0-based) has experts, as transformers decides it.
    pub fn is_sparse(&self, index: usize) -> bool {
        !self.dense_layers.contains(&index) && (index + 1).is_multiple_of(self.sparse_step)
    }
}

/// A list of layer indices (`mlp_only_layers`); absent or null is empty.
fn layer_list(config: &JsonObject<'_>, field: &str) -> Result<Vec<usize>, ModelError> {
    match config.get(field) {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| {
                item.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| config.invalid(field, "expected a list of layer indices"))
            })
            .collect(),
        Some(_) => Err(config.invalid(field, "expected a list of layer indices")),
    }
}
