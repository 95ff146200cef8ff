//! FP8 checkpoints as published (`tests/fixtures/fp8/`, made by `scripts/make_fp8_fixtures.py`
//! from inferno-tiny) and FP8 quantized at load, on the CPU backend: each format loads with its
//! scales, its weights dequantize as an independent implementation computes them, and the model
//! predicts what the bf16 model predicts.

mod support;

use std::path::Path;

use inferno::backend::cpu::CpuBackend;
use inferno::model::{
    Model, ModelDefinition, QuantizationMethod, QuantizeAtLoad, fp8::ActivationScale, layout,
};
use serde::Deserialize;
use support::{committed_fixture, golden, logits_per_position};

/// The four published forms and the method each declares.
const FORMATS: [(&str, QuantizationMethod); 4] = [
    (
        "compressed-tensors-dynamic",
        QuantizationMethod::CompressedTensors,
    ),
    (
        "compressed-tensors-static",
        QuantizationMethod::CompressedTensors,
    ),
    ("fbgemm", QuantizationMethod::FbgemmFp8),
    ("block", QuantizationMethod::Fp8),
];

fn fp8_fixture(name: &str) -> std::path::PathBuf {
    committed_fixture("fp8").join(name)
}

/// What `scripts/make_fp8_fixtures.py` computed for one projection, with numpy.
#[derive(Deserialize)]
struct Expected {
    sum: f64,
    first: Vec<f32>,
}

fn argmax(row: &[f32]) -> usize {
    inferno::engine::sampling::argmax(row) as usize
}

/// Top-1 agreement and the largest absolute logit difference of `model` against `reference`
/// over the golden prompts of inferno-tiny (up to 96 tokens each).
fn compare(model: &Model, reference: &Model) -> (f64, f32) {
    let mut ours = CpuBackend::new(model, 16 << 20).expect("backend builds");
    let mut theirs = CpuBackend::new(reference, 16 << 20).expect("backend builds");
    let (mut agree, mut total, mut max_err) = (0usize, 0usize, 0f32);
    for case in golden(&committed_fixture("inferno-tiny")) {
        let tokens = &case.input_ids[..case.input_ids.len().min(96)];
        let a = logits_per_position(&mut ours, tokens);
        let b = logits_per_position(&mut theirs, tokens);
        for (x, y) in a.iter().zip(&b) {
            agree += usize::from(argmax(x) == argmax(y));
            total += 1;
            for (p, q) in x.iter().zip(y) {
                max_err = max_err.max((p - q).abs());
            }
        }
    }
    (agree as f64 / total as f64, max_err)
}

#[test]
fn every_published_form_loads_with_its_scales() {
    for (name, method) in FORMATS {
        let dir = fp8_fixture(name);
        let model = Model::load(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        let quantization = model.config.quantization.as_ref().expect("FP8 declared");
        assert_eq!(quantization.method, method, "{name}");
        let tensors = layout(&model.definition(), Some(quantization));
        // The LM head (tied to the embeddings here) stays 16-bit; every projection is FP8.
        assert!(tensors.lm_head.fp8.is_none());
        for layer in &tensors.layers {
            let mlp = layer.mlp.dense().expect("a dense MLP");
            for projection in [&layer.q_proj, &mlp.down_proj] {
                assert!(projection.weight.fp8, "{name}: {}", projection.weight.name);
                assert!(projection.fp8.as_ref().unwrap().scale.is_some());
            }
        }
        assert!(
            model.config.served_format().starts_with("fp8-e4m3"),
            "{}",
            model.config.served_format()
        );
    }
}

/// The loader's dequantized weights equal numpy's (scales per tensor, channel and block).
#[test]
fn dequantized_weights_match_an_independent_implementation() {
    for (name, _) in FORMATS {
        let dir = fp8_fixture(name);
        let model = Model::load(&dir).unwrap();
        let expected: std::collections::BTreeMap<String, Expected> =
            serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
        assert_eq!(expected.len(), 7, "{name}: every projection of layer 0");
        let tensors = layout(&model.definition(), model.config.quantization.as_ref());
        let layer = &tensors.layers[0];
        let mlp = layer.mlp.dense().expect("a dense MLP");
        for projection in [
            &layer.q_proj,
            &layer.k_proj,
            &layer.v_proj,
            &layer.o_proj,
            &mlp.gate_proj,
            &mlp.up_proj,
            &mlp.down_proj,
        ] {
            let want = &expected[&projection.weight.name];
            let got = model.weights.linear_f32(projection).unwrap();
            // numpy multiplies in float64: the f32 product may differ in the last bit.
            for (g, w) in got.iter().zip(&want.first) {
                assert!(
                    (g - w).abs() <= 1e-6 * w.abs(),
                    "{name}: {}: {g} != {w}",
                    projection.weight.name
                );
            }
            let sum: f64 = got.iter().map(|&v| f64::from(v)).sum();
            assert!(
                (sum - want.sum).abs() <= 1e-4 * want.sum.abs().max(1.0),
                "{name}: {}: {sum} != {}",
                projection.weight.name,
                want.sum
            );
        }
    }
}

/// Each published form predicts what the bf16 model predicts: top-1 agreement over the golden
/// prompts, and logits close to the bf16 ones. inferno-tiny is a 128-wide model whose top two
/// logits are often close, so FP8 flips more of its predictions than it does a real model's
/// (measured: 0.92 for the per-channel dynamic form); the real model's perplexity check is
/// `smollm2_fp8.rs`.
#[test]
fn fp8_forms_agree_with_bf16_on_the_cpu() {
    let reference = Model::load(&committed_fixture("inferno-tiny")).unwrap();
    for (name, _) in FORMATS {
        let model = Model::load(&fp8_fixture(name)).unwrap();
        let (agreement, max_err) = compare(&model, &reference);
        eprintln!("{name}: top-1 agreement {agreement:.4}, max |logit diff| {max_err:.3}");
        assert!(agreement >= 0.85, "{name}: top-1 agreement {agreement}");
        assert!(max_err < 3.0, "{name}: max logit difference {max_err}");
        assert!(max_err > 0.0, "{name}: FP8 must change the logits");
    }
}

/// `--quantization fp8` on the bf16 model: per-channel weights, dynamic per-token activations,
/// the same digest; and the same prediction as the published per-channel dynamic form (which
/// quantizes the same weights the same way).
#[test]
fn quantized_at_load_matches_the_published_channel_dynamic_form() {
    let reference = Model::load(&committed_fixture("inferno-tiny")).unwrap();
    let mut at_load = Model::load(&committed_fixture("inferno-tiny")).unwrap();
    QuantizeAtLoad::Fp8.apply(&mut at_load.config);
    assert_eq!(
        at_load.digest, reference.digest,
        "the digest is of the files"
    );
    let quantization = at_load.config.quantization.clone().unwrap();
    assert_eq!(quantization.method, QuantizationMethod::AtLoad);
    assert_eq!(
        quantization.activations,
        ActivationScale::DynamicPerToken { upper_bound: None }
    );
    let published = Model::load(&fp8_fixture("compressed-tensors-dynamic")).unwrap();
    let mut a = CpuBackend::new(&at_load, 16 << 20).unwrap();
    let mut b = CpuBackend::new(&published, 16 << 20).unwrap();
    let tokens = &golden(&committed_fixture("inferno-tiny"))[0].input_ids;
    let (x, y) = (
        logits_per_position(&mut a, tokens),
        logits_per_position(&mut b, tokens),
    );
    for (pos, (p, q)) in x.iter().zip(&y).enumerate() {
        let err = p
            .iter()
            .zip(q)
            .map(|(u, v)| (u - v).abs())
            .fold(0f32, f32::max);
        assert!(err < 1e-3, "position {pos}: {err}");
    }
    let (agreement, _) = compare(&at_load, &reference);
    assert!(agreement >= 0.85, "{agreement}");
}

/// A projection the quantization_config declares FP8 but stored in bf16 is refused in one line
/// naming the tensor.
#[test]
fn a_projection_stored_in_the_wrong_dtype_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let source = committed_fixture("inferno-tiny");
    for entry in std::fs::read_dir(&source).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fp8_fixture("fbgemm").join("config.json")).unwrap())
            .unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        serde_json::to_vec(&config).unwrap(),
    )
    .unwrap();
    let err = Model::load(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("model.layers.0.self_attn.q_proj.weight") && err.contains("F8_E4M3"),
        "{err}"
    );
    assert!(!err.contains('\n'), "{err}");
    // And the definition a checkpoint declares is the same with or without FP8.
    let fp8 = Model::load(&fp8_fixture("fbgemm")).unwrap();
    let bf16 = Model::load(Path::new(&source)).unwrap();
    assert_eq!(
        ModelDefinition::of(&fp8.config),
        ModelDefinition::of(&bf16.config)
    );
}

/// A sealed FP8 model opens to the plaintext's digest (which covers the scales) and computes
/// what the plaintext computes.
#[test]
fn a_sealed_fp8_model_loads_like_the_plaintext() {
    use inferno::model::ModelDigest;
    use inferno::seal::manifest::MIN_CHUNK_SIZE;
    use inferno::seal::{ModelKey, SealOptions, open_sealed, seal_dir};

    let plain = fp8_fixture("block");
    let work = tempfile::tempdir().unwrap();
    let key = ModelKey::generate().unwrap();
    let options = SealOptions {
        chunk_size: MIN_CHUNK_SIZE,
        ..SealOptions::default()
    };
    seal_dir(&plain, &work.path().join("sealed"), &key, &options).expect("sealing works");
    let (manifest, files) = open_sealed(&work.path().join("sealed"), &key).expect("it opens");
    let reference = ModelDigest::of_dir(&plain).unwrap();
    assert_eq!(manifest.model_digest, reference.hex);
    let sealed = Model::from_files(&files, "sealed".into()).expect("the sealed model loads");
    drop(files);
    assert_eq!(sealed.digest, reference);
    assert_eq!(
        sealed.config.quantization.as_ref().map(|q| q.method),
        Some(QuantizationMethod::Fp8)
    );
    let plaintext = Model::load(&plain).unwrap();
    let tokens = &golden(&committed_fixture("inferno-tiny"))[0].input_ids;
    let mut a = CpuBackend::new(&sealed, 16 << 20).unwrap();
    let mut b = CpuBackend::new(&plaintext, 16 << 20).unwrap();
    assert_eq!(
        logits_per_position(&mut a, tokens),
        logits_per_position(&mut b, tokens)
    );

    // The digest covers the scales: a different scale is a different model.
    let copy = work.path().join("copy");
    std::fs::create_dir(&copy).unwrap();
    for entry in std::fs::read_dir(&plain).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, copy.join(path.file_name().unwrap())).unwrap();
    }
    let weights = copy.join("model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let meta: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header]).unwrap();
    let scale = &meta["model.layers.0.self_attn.q_proj.weight_scale_inv"]["data_offsets"];
    let at = 8 + header + scale[0].as_u64().unwrap() as usize;
    bytes[at + 3] ^= 0x01;
    std::fs::write(&weights, bytes).unwrap();
    assert_ne!(ModelDigest::of_dir(&copy).unwrap(), reference);
}

/// An FP8 KV cache on the CPU: keys and values rounded to E4M3 as they are written (scale 1.0
/// without checkpoint scales). The logits move, and the predictions stay the bf16 cache's.
#[test]
fn an_fp8_kv_cache_rounds_keys_and_values() {
    use inferno::engine::KvCacheDtype;
    let model = Model::load(&committed_fixture("inferno-tiny")).unwrap();
    let tokens = &golden(&committed_fixture("inferno-tiny"))[0].input_ids;
    let mut plain = CpuBackend::new(&model, 16 << 20).unwrap();
    let mut fp8 = CpuBackend::new(&model, 16 << 20)
        .unwrap()
        .with_kv_cache_dtype(KvCacheDtype::Fp8, model.tensors())
        .unwrap();
    let (a, b) = (
        logits_per_position(&mut plain, tokens),
        logits_per_position(&mut fp8, tokens),
    );
    // The first position attends to itself only, whose value row is rounded too.
    let mut max_err = 0f32;
    let mut agree = 0;
    for (x, y) in a.iter().zip(&b) {
        agree += usize::from(argmax(x) == argmax(y));
        for (p, q) in x.iter().zip(y) {
            max_err = max_err.max((p - q).abs());
        }
    }
    eprintln!(
        "fp8 KV cache: top-1 agreement {agree}/{}, max |logit diff| {max_err:.4}",
        a.len()
    );
    assert!(max_err > 0.0, "the FP8 cache must round something");
    assert!(max_err < 1.0, "{max_err}");
    assert!(agree * 100 >= a.len() * 90, "{agree} of {}", a.len());
}

/// The FP8 cache's per-layer scales come from the checkpoint's `self_attn.k_scale` and
/// `v_scale` where it has them, else 1.0; an unusable scale is refused in one line naming the
/// tensor. The CPU backend's FP8 cache rounds at those scales, so its logits move with them.
#[test]
fn kv_cache_scales_come_from_the_checkpoint() {
    use inferno::engine::KvCacheDtype;
    use inferno::model::kv_scales::kv_cache_scales;
    let plain = Model::load(&committed_fixture("inferno-tiny")).unwrap();
    let layers = plain.config.num_hidden_layers;
    assert_eq!(
        kv_cache_scales(&plain.weights, layers).unwrap(),
        vec![[1.0, 1.0]; layers]
    );
    let scaled_dir = support::copy_with_kv_scales(&committed_fixture("inferno-tiny"), |i| {
        [0.02 + 0.01 * i as f32, 0.5 / (i + 1) as f32]
    });
    let scaled = Model::load(scaled_dir.path()).unwrap();
    let expected: Vec<[f32; 2]> = (0..layers)
        .map(|i| [0.02 + 0.01 * i as f32, 0.5 / (i + 1) as f32])
        .collect();
    assert_eq!(kv_cache_scales(&scaled.weights, layers).unwrap(), expected);

    let tokens = &golden(&committed_fixture("inferno-tiny"))[0].input_ids;
    let fp8 = |model: &Model| {
        let mut backend = CpuBackend::new(model, 16 << 20)
            .unwrap()
            .with_kv_cache_dtype(KvCacheDtype::Fp8, model.tensors())
            .unwrap();
        logits_per_position(&mut backend, tokens)
    };
    let (at_one, at_scales) = (fp8(&plain), fp8(&scaled));
    let moved = at_one
        .iter()
        .flatten()
        .zip(at_scales.iter().flatten())
        .any(|(a, b)| a != b);
    assert!(moved, "the checkpoint's scales changed no logit");

    let bad_dir = support::copy_with_kv_scales(&committed_fixture("inferno-tiny"), |_| [-1.0, 1.0]);
    let bad = Model::load(bad_dir.path()).unwrap();
    let err = kv_cache_scales(&bad.weights, layers)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("model.layers.0.self_attn.k_scale") && !err.contains('\n'),
        "{err}"
    );
}
