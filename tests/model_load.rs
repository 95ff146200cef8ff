//! Loading synthetic model directories: every supported layout loads, and every kind of bad
//! input is rejected with a one-line error naming the file or tensor.

use std::collections::BTreeMap;
use std::path::Path;

use inferno::model::{self, DType, Model, ModelConfig, ModelDefinition, ModelDigest, ModelError};
use safetensors::Dtype;
use serde_json::json;

/// A word-level tokenizer small enough to write inline.
const TOKENIZER: &str = r#"{
  "version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [{"id": 0, "content": "<s>", "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true},
                   {"id": 1, "content": "</s>", "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true}],
  "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
  "decoder": null,
  "model": {"type": "WordLevel", "vocab": {"<s>": 0, "</s>": 1, "<unk>": 2, "hello": 3, "world": 4},
            "unk_token": "<unk>"}
}"#;

/// A tiny config of `arch`; `extra` fields override the defaults.
fn config(arch: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut config = json!({
        "architectures": [arch], "hidden_size": 8, "intermediate_size": 12,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
        "vocab_size": 5, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "tie_word_embeddings": true, "eos_token_id": 1
    });
    if let (Some(base), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
        base.extend(extra.clone());
    }
    config
}

/// One tensor to write: dtype, shape and raw bytes.
struct Tensor {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl Tensor {
    /// An FP8 E4M3 tensor of small finite values that differ with `seed`.
    fn fp8(shape: &[usize], seed: usize) -> Self {
        let n: usize = shape.iter().product();
        // Codes 0x30..0x3f and their negatives: magnitudes 0.5 to about 1.9.
        let data = (0..n)
            .map(|i| {
                let sign = if (seed + i).is_multiple_of(3) {
                    0x80
                } else {
                    0
                };
                (0x30 + ((seed + i) % 16) as u8) | sign
            })
            .collect();
        Self {
            dtype: Dtype::F8_E4M3,
            shape: shape.to_vec(),
            data,
        }
    }

    /// An f32 tensor whose elements are `seed, seed + 1, ...`.
    fn f32(shape: &[usize], seed: f32) -> Self {
        let n: usize = shape.iter().product();
        let data = (0..n)
            .flat_map(|i| (seed + i as f32).to_le_bytes())
            .collect();
        Self {
            dtype: Dtype::F32,
            shape: shape.to_vec(),
            data,
        }
    }
}

/// The tensors `config` needs, in f32, keyed by name.
fn tensors_for(config: &serde_json::Value) -> BTreeMap<String, Tensor> {
    let parsed =
        ModelConfig::from_json(Path::new("config.json"), config.to_string().as_bytes()).unwrap();
    model::layout(&ModelDefinition::of(&parsed), parsed.quantization.as_ref())
        .all()
        .into_iter()
        .enumerate()
        .map(|(i, spec)| {
            let tensor = if spec.fp8 {
                Tensor::fp8(&spec.shape, i)
            } else {
                Tensor::f32(&spec.shape, i as f32)
            };
            (spec.name.clone(), tensor)
        })
        .collect()
}

/// Serialises tensors in safetensors format.
fn safetensors_bytes(tensors: &BTreeMap<String, Tensor>) -> Vec<u8> {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(name, t)| {
            let view =
                safetensors::tensor::TensorView::new(t.dtype, t.shape.clone(), &t.data).unwrap();
            (name.clone(), view)
        })
        .collect();
    safetensors::serialize(views, None).unwrap()
}

/// Writes a model directory named `name` inside a fresh tempdir.
fn write_dir(
    name: &str,
    config: &serde_json::Value,
    tensors: &BTreeMap<String, Tensor>,
) -> (tempfile::TempDir, std::path::PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join(name);
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::write(dir.join("tokenizer.json"), TOKENIZER).unwrap();
    std::fs::write(dir.join("model.safetensors"), safetensors_bytes(tensors)).unwrap();
    (root, dir)
}

/// Loads `dir` and returns the error's message, checking it is one line.
fn load_err(dir: &Path) -> String {
    let err = Model::load(dir).expect_err("load should fail").to_string();
    assert!(!err.contains('\n'), "multi-line error: {err}");
    err
}

#[test]
fn loads_a_single_file_llama_and_converts_tensors() {
    let config = config("LlamaForCausalLM", json!({}));
    let tensors = tensors_for(&config);
    let (_root, dir) = write_dir("tiny-test", &config, &tensors);
    std::fs::write(
        dir.join("tokenizer_config.json"),
        json!({"bos_token": "<s>", "eos_token": {"content": "</s>"}, "chat_template": "{{ bos_token }}{{ messages[0].content }}"}).to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"eos_token_id": [1], "temperature": 0.7}"#,
    )
    .unwrap();

    let model = Model::load(&dir).unwrap();
    assert_eq!(model.name, "tiny-test");
    assert_eq!(model.config.num_hidden_layers, 2);
    assert_eq!(model.generation.temperature, Some(0.7));
    assert_eq!(model.eos_token_ids(), vec![1]);
    assert_eq!(model.special.bos_token.as_deref(), Some("<s>"));
    assert_eq!(model.digest, ModelDigest::of_dir(&dir).unwrap());
    assert_eq!(model.digest.files.len(), 5);

    let embed = model.weights.tensor("model.embed_tokens.weight").unwrap();
    assert_eq!(embed.dtype, DType::F32);
    assert_eq!(embed.shape, vec![5, 8]);
    let values = model
        .weights
        .to_f32("model.embed_tokens.weight", &[5, 8])
        .unwrap();
    assert_eq!(values[..3], [0.0, 1.0, 2.0]);
    let err = model
        .weights
        .to_f32("model.embed_tokens.weight", &[8, 5])
        .unwrap_err();
    assert!(matches!(err, ModelError::TensorShape { .. }), "{err}");

    let template = model.chat_template.as_ref().unwrap();
    let prompt = template
        .render(
            &[json!({"role": "user", "content": "hello world"})],
            None,
            true,
            &Default::default(),
        )
        .unwrap();
    assert_eq!(prompt, "<s>hello world");
    let ids = model.tokenizer.encode(prompt.as_str(), false).unwrap();
    assert_eq!(ids.get_ids(), [0, 3, 4]);
}

#[test]
fn converts_bf16_and_f16_tensors() {
    let config = config("LlamaForCausalLM", json!({}));
    let mut tensors = tensors_for(&config);
    // 1.0, -2.0, 0.5, 3.0, ... as bf16 and f16 bit patterns.
    let bf16: [u16; 8] = [0x3f80, 0xc000, 0x3f00, 0x4040, 0, 0x8000, 0x4100, 0x3e80];
    let f16: [u16; 8] = [0x3c00, 0xc000, 0x3800, 0x4200, 0, 0x8000, 0x4800, 0x3400];
    let expected = [1.0, -2.0, 0.5, 3.0, 0.0, -0.0, 8.0, 0.25];
    let bytes = |bits: &[u16; 8]| bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    tensors.insert(
        "model.norm.weight".into(),
        Tensor {
            dtype: Dtype::BF16,
            shape: vec![8],
            data: bytes(&bf16),
        },
    );
    tensors.insert(
        "model.layers.0.input_layernorm.weight".into(),
        Tensor {
            dtype: Dtype::F16,
            shape: vec![8],
            data: bytes(&f16),
        },
    );
    let (_root, dir) = write_dir("m", &config, &tensors);
    let model = Model::load(&dir).unwrap();
    assert_eq!(
        model.weights.tensor("model.norm.weight").unwrap().dtype,
        DType::BF16
    );
    assert_eq!(
        model.weights.to_f32("model.norm.weight", &[8]).unwrap(),
        expected
    );
    assert_eq!(
        model
            .weights
            .to_f32("model.layers.0.input_layernorm.weight", &[8])
            .unwrap(),
        expected
    );
}

#[test]
fn loads_sharded_weights_through_the_index() {
    let config = config("Qwen2ForCausalLM", json!({"tie_word_embeddings": false}));
    let tensors = tensors_for(&config);
    assert!(
        tensors.contains_key("lm_head.weight")
            && tensors.contains_key("model.layers.1.self_attn.v_proj.bias")
    );
    let (_root, dir) = write_dir("sharded", &config, &BTreeMap::new());
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();

    let (first, second): (BTreeMap<_, _>, BTreeMap<_, _>) = tensors
        .into_iter()
        .partition(|(name, _)| name.starts_with("model.layers.0"));
    let mut weight_map = serde_json::Map::new();
    for (names, file) in [
        (&first, "model-00001-of-00002.safetensors"),
        (&second, "model-00002-of-00002.safetensors"),
    ] {
        std::fs::write(dir.join(file), safetensors_bytes(names)).unwrap();
        for name in names.keys() {
            weight_map.insert(name.clone(), json!(file));
        }
    }
    let index = json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();

    let model = Model::load(&dir).unwrap();
    assert_eq!(model.config.architecture, model::Architecture::Qwen2);
    assert_eq!(
        model
            .weights
            .tensor("model.layers.0.self_attn.q_proj.bias")
            .unwrap()
            .shape,
        vec![8]
    );
    assert_eq!(
        model.weights.tensor("lm_head.weight").unwrap().shape,
        vec![5, 8]
    );

    // An index that assigns a tensor to the wrong shard is rejected, naming both.
    let mut wrong = index.clone();
    wrong["weight_map"]["lm_head.weight"] = json!("model-00001-of-00002.safetensors");
    std::fs::write(dir.join("model.safetensors.index.json"), wrong.to_string()).unwrap();
    let err = load_err(&dir);
    assert!(
        err.contains("lm_head.weight") && err.contains("model-00001-of-00002.safetensors"),
        "{err}"
    );

    // A shard the index names but the directory lacks.
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    std::fs::remove_file(dir.join("model-00002-of-00002.safetensors")).unwrap();
    let err = load_err(&dir);
    assert!(
        err.contains("model-00002-of-00002.safetensors") && err.contains("not found"),
        "{err}"
    );
}

#[test]
fn qwen3_needs_qk_norms_and_untied_llama_needs_lm_head() {
    let qwen3 = config("Qwen3ForCausalLM", json!({"head_dim": 8}));
    let mut tensors = tensors_for(&qwen3);
    assert_eq!(
        tensors["model.layers.0.self_attn.q_proj.weight"].shape,
        vec![16, 8]
    );
    tensors.remove("model.layers.1.self_attn.k_norm.weight");
    let (_root, dir) = write_dir("q3", &qwen3, &tensors);
    let err = load_err(&dir);
    assert!(
        err.contains("model.layers.1.self_attn.k_norm.weight") && err.contains("not found"),
        "{err}"
    );

    let tied = config("LlamaForCausalLM", json!({}));
    let untied = config("LlamaForCausalLM", json!({"tie_word_embeddings": false}));
    let (_root, dir) = write_dir("untied", &untied, &tensors_for(&tied));
    let err = load_err(&dir);
    assert!(err.contains("lm_head.weight"), "{err}");
}

#[test]
fn missing_files_are_named() {
    let config = config("LlamaForCausalLM", json!({}));
    let tensors = tensors_for(&config);
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        let (_root, dir) = write_dir("m", &config, &tensors);
        std::fs::remove_file(dir.join(file)).unwrap();
        let err = load_err(&dir);
        assert!(
            err.contains(file) && err.contains("not found"),
            "{file}: {err}"
        );
    }
}

#[test]
fn corrupt_safetensors_headers_are_named() {
    let config = config("LlamaForCausalLM", json!({}));
    let tensors = tensors_for(&config);
    let good = safetensors_bytes(&tensors);
    let mut bad_json = good.clone();
    bad_json[8] = b'#';
    let mut huge_len = good.clone();
    huge_len[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    let truncated = good[..good.len() - 4].to_vec();
    for (what, bytes) in [
        ("garbage", b"not a safetensors file".to_vec()),
        ("bad json", bad_json),
        ("huge header", huge_len),
        ("truncated", truncated),
        ("empty", Vec::new()),
    ] {
        let (_root, dir) = write_dir("m", &config, &tensors);
        std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
        let err = load_err(&dir);
        assert!(
            err.contains("model.safetensors") && err.contains("corrupt safetensors header"),
            "{what}: {err}"
        );
    }
}

#[test]
fn wrong_shape_and_dtype_are_named() {
    let config = config("MistralForCausalLM", json!({}));
    let mut tensors = tensors_for(&config);
    tensors.insert(
        "model.layers.1.mlp.up_proj.weight".into(),
        Tensor::f32(&[8, 12], 0.0),
    );
    let (_root, dir) = write_dir("m", &config, &tensors);
    let err = load_err(&dir);
    assert!(
        err.contains("model.layers.1.mlp.up_proj.weight")
            && err.contains("[8, 12]")
            && err.contains("[12, 8]"),
        "{err}"
    );

    let mut tensors = tensors_for(&config);
    tensors.insert(
        "model.norm.weight".into(),
        Tensor {
            dtype: Dtype::I64,
            shape: vec![8],
            data: vec![0; 64],
        },
    );
    let (_root, dir) = write_dir("m", &config, &tensors);
    let err = load_err(&dir);
    assert!(
        err.contains("model.norm.weight")
            && err.contains("I64")
            && err.contains("model.safetensors"),
        "{err}"
    );
}

#[test]
fn unknown_architecture_and_bad_json_are_named() {
    let good = config("LlamaForCausalLM", json!({}));
    let tensors = tensors_for(&good);
    let (_root, dir) = write_dir("m", &config("FalconForCausalLM", json!({})), &tensors);
    let err = load_err(&dir);
    assert!(
        err.contains("config.json") && err.contains("FalconForCausalLM"),
        "{err}"
    );

    let (_root, dir) = write_dir("m", &good, &tensors);
    std::fs::write(dir.join("tokenizer.json"), "{").unwrap();
    let err = load_err(&dir);
    assert!(err.contains("tokenizer.json"), "{err}");

    std::fs::write(dir.join("tokenizer.json"), TOKENIZER).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"chat_template": "{% for %}"}"#,
    )
    .unwrap();
    let err = load_err(&dir);
    assert!(
        err.contains("tokenizer_config.json") && err.contains("chat template"),
        "{err}"
    );

    std::fs::write(dir.join("tokenizer_config.json"), "{}").unwrap();
    std::fs::write(dir.join("generation_config.json"), r#"{"top_k": -1}"#).unwrap();
    let err = load_err(&dir);
    assert!(
        err.contains("generation_config.json") && err.contains("top_k"),
        "{err}"
    );
}

#[test]
fn embedded_models_load_from_memory_with_the_same_digest() {
    let config = config("LlamaForCausalLM", json!({}));
    let tensors = tensors_for(&config);
    let (_root, dir) = write_dir("m", &config, &tensors);
    let on_disk = Model::load(&dir).unwrap();

    // Leaked here to stand in for `include_bytes!` data, which lives for the whole program.
    let leak = |bytes: Vec<u8>| -> &'static [u8] { Box::leak(bytes.into_boxed_slice()) };
    let files = [
        ("config.json", leak(config.to_string().into_bytes())),
        ("tokenizer.json", leak(TOKENIZER.as_bytes().to_vec())),
        ("model.safetensors", leak(safetensors_bytes(&tensors))),
    ];
    let embedded = Model::from_memory("embedded-tiny", &files).unwrap();
    assert_eq!(embedded.name, "embedded-tiny");
    assert_eq!(embedded.digest, on_disk.digest);
    assert_eq!(
        embedded.weights.to_f32("model.norm.weight", &[8]).unwrap(),
        on_disk.weights.to_f32("model.norm.weight", &[8]).unwrap()
    );

    let err = Model::from_memory("x", &files[..2])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("model.safetensors") && err.contains("not found"),
        "{err}"
    );
}

#[test]
fn token_ids_must_fit_the_vocabulary() {
    // The tokenizer knows ids 0..=4, so a vocabulary of 4 cannot embed all of them.
    let small = config("LlamaForCausalLM", json!({"vocab_size": 4}));
    let (_root, dir) = write_dir("m", &small, &tensors_for(&small));
    let err = load_err(&dir);
    assert!(
        err.contains("tokenizer.json") && err.contains("token id 4"),
        "{err}"
    );

    let good = config("LlamaForCausalLM", json!({}));
    let (_root, dir) = write_dir("m", &good, &tensors_for(&good));
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"eos_token_id": [1, 9]}"#,
    )
    .unwrap();
    let err = load_err(&dir);
    assert!(
        err.contains("generation_config.json") && err.contains("eos_token_id"),
        "{err}"
    );
}

/// The shell recipe of docs/model-loading.md ("Model digest"), run by `sh` with coreutils.
const DIGEST_RECIPE: &str = r#"find -L . -maxdepth 1 -type f -printf '%f\n' |
  while IFS= read -r f; do
    printf '%s\t%s\n' "$f" "$(split -b 16M --filter=sha256sum < "$f" | cut -d' ' -f1 | sha256sum | cut -d' ' -f1)"
  done | LC_ALL=C sort | sha256sum | cut -d' ' -f1"#;

#[test]
fn the_digest_equals_the_documented_shell_recipe() {
    let dir = tempfile::tempdir().unwrap();
    let block = model::digest::DIGEST_BLOCK;
    // Three full 16 MiB blocks and a partial one; a file of exactly one block; an empty file.
    let big: Vec<u8> = (0..3 * block + 777).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(dir.path().join("model-00001.safetensors"), &big).unwrap();
    std::fs::write(dir.path().join("one block"), &big[..block]).unwrap();
    std::fs::write(dir.path().join("empty"), b"").unwrap();
    std::fs::write(dir.path().join("config.json"), b"{}").unwrap();
    std::fs::write(dir.path().join(".hidden"), b"x").unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();

    let output = std::process::Command::new("sh")
        .arg("-c")
        .arg(DIGEST_RECIPE)
        .current_dir(dir.path())
        .output()
        .expect("sh runs");
    assert!(output.status.success(), "{output:?}");
    let shell = String::from_utf8(output.stdout).unwrap().trim().to_owned();
    assert_eq!(shell.len(), 64, "{shell}");

    let reference = ModelDigest::of_dir(dir.path()).unwrap();
    assert_eq!(reference.hex, shell);
    assert_eq!(reference.files.len(), 5);
    let loaded = model::ModelFiles::read_dir(dir.path()).unwrap();
    assert_eq!(loaded.digest(), &reference);
    // The empty file's value is the SHA-256 of no lines at all.
    let empty = reference.files.iter().find(|f| f.name == "empty").unwrap();
    assert_eq!(
        empty.value,
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
    // The big file's value is not its plain SHA-256 (so the test tells the two apart).
    let whole = hex::encode(ring::digest::digest(&ring::digest::SHA256, &big));
    let value = &reference
        .files
        .iter()
        .find(|f| f.name.starts_with("model"))
        .unwrap()
        .value;
    assert_ne!(value, &whole);
}
