//! The shared tiny-llama3 fixture (a real Hugging Face directory written by transformers 5):
//! its config, weights, digest, tokenizer and chat template reproduce golden.json's prompts.

use std::path::{Path, PathBuf};

use inferno::model::{Architecture, DType, Model, ModelDigest, RopeScaling};
use serde_json::Value;

/// The fixture directory (the tests are ignored without it, `cfg(shared_fixture)`).
fn fixture() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/tiny-llama3");
    assert!(
        dir.join("config.json").is_file(),
        "{} is absent",
        dir.display()
    );
    dir
}

/// The golden cases.
fn golden(dir: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(dir.join("golden.json")).unwrap();
    let golden: Value = serde_json::from_str(&text).unwrap();
    golden["cases"].as_array().unwrap().clone()
}

/// A case's expected ids.
fn ids(case: &Value) -> Vec<u32> {
    case["input_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| u32::try_from(v.as_u64().unwrap()).unwrap())
        .collect()
}

#[test]
#[cfg_attr(not(shared_fixture), ignore = "needs ../shared/fixtures/tiny-llama3")]
fn loads_config_weights_and_digest() {
    let dir = fixture();
    let model = Model::load(&dir).unwrap();
    assert_eq!(model.name, "tiny-llama3");
    let c = &model.config;
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!(
        (
            c.hidden_size,
            c.num_hidden_layers,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim
        ),
        (64, 3, 4, 2, 16)
    );
    assert_eq!(c.vocab_size, 128_256);
    assert!(c.tie_word_embeddings);
    assert_eq!(c.rope.theta, 500_000.0);
    assert!(matches!(
        c.rope.scaling,
        RopeScaling::Llama3 {
            factor: 8.0,
            original_max_position_embeddings: 32,
            ..
        }
    ));
    assert_eq!(model.eos_token_ids(), vec![128_001, 128_008, 128_009]);
    assert_eq!(
        model.special.bos_token.as_deref(),
        Some("<|begin_of_text|>")
    );

    let embed = model.weights.tensor("model.embed_tokens.weight").unwrap();
    assert_eq!(embed.dtype, DType::BF16);
    assert_eq!(embed.shape, vec![128_256, 64]);
    let norm = model
        .weights
        .to_f32("model.layers.2.post_attention_layernorm.weight", &[64])
        .unwrap();
    assert!(norm.iter().all(|v| v.is_finite()) && norm.iter().any(|v| *v != 0.0));

    assert_eq!(model.digest.files.len(), 9);
    assert_eq!(model.digest, ModelDigest::of_dir(&dir).unwrap());
    // Computed independently with the shell pipeline in docs/model-loading.md.
    assert_eq!(
        model.digest.hex,
        "217b27c3ecafa17c63930d6c8c3274f98dfcb52587a519fa496b2df7a7706bfc"
    );
}

#[test]
#[cfg_attr(not(shared_fixture), ignore = "needs ../shared/fixtures/tiny-llama3")]
fn chat_template_and_tokenizer_reproduce_golden_input_ids() {
    let dir = fixture();
    let model = Model::load(&dir).unwrap();
    let template = model.chat_template.as_ref().unwrap();
    let mut checked = 0;
    for case in golden(&dir) {
        let prompt = match case["kind"].as_str().unwrap() {
            "chat" => {
                let messages = case["input"].as_array().unwrap();
                let text = template
                    .render(messages, None, true, &Default::default())
                    .unwrap();
                // The template writes BOS itself, so no special tokens are added.
                model.tokenizer.encode(text.as_str(), false).unwrap()
            }
            "raw" => model
                .tokenizer
                .encode(case["input"].as_str().unwrap(), true)
                .unwrap(),
            other => panic!("unknown case kind {other}"),
        };
        assert_eq!(
            prompt.get_ids(),
            ids(&case).as_slice(),
            "case {}",
            case["input"]
        );
        checked += 1;
    }
    assert_eq!(checked, 5);
}
