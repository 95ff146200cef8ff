//! The committed tiny fixtures (Llama with llama3 RoPE, Qwen2 with biases and an untied head,
//! Qwen3 with q/k norms and `chat_template.jinja`) load, and their templates and tokenizers
//! reproduce the prompts transformers produced in each `golden.json`.

use std::path::{Path, PathBuf};

use inferno::model::{Architecture, Model, RopeScaling};
use serde_json::{Map, Value, json};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Checks every golden case's `input_ids`: chat cases through the model's template (with the
/// generation prompt, no special tokens added), raw cases tokenized with the defaults.
fn check_golden_prompts(model: &Model, dir: &Path) {
    let golden: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap();
    let template = model
        .chat_template
        .as_ref()
        .expect("fixture has a chat template");
    let cases = golden["cases"].as_array().unwrap();
    assert!(cases.len() >= 4);
    for case in cases {
        let encoding = match case["kind"].as_str().unwrap() {
            "chat" => {
                let prompt = template
                    .render(case["input"].as_array().unwrap(), None, true, &Map::new())
                    .unwrap();
                model.tokenizer.encode(prompt.as_str(), false).unwrap()
            }
            _ => model
                .tokenizer
                .encode(case["input"].as_str().unwrap(), true)
                .unwrap(),
        };
        let expected: Vec<u32> = serde_json::from_value(case["input_ids"].clone()).unwrap();
        assert_eq!(
            encoding.get_ids(),
            expected.as_slice(),
            "{}: {}",
            model.name,
            case["input"]
        );
    }
}

#[test]
fn inferno_tiny_llama_with_llama3_rope() {
    let dir = fixture("inferno-tiny");
    let model = Model::load(&dir).unwrap();
    assert_eq!(model.name, "inferno-tiny");
    assert_eq!(model.config.architecture, Architecture::Llama);
    assert!(matches!(
        model.config.rope.scaling,
        RopeScaling::Llama3 { .. }
    ));
    assert!(model.config.tie_word_embeddings);
    assert_eq!(model.generation.bos_token_id, Some(0));
    assert_eq!(model.eos_token_ids(), vec![1, 4]);
    check_golden_prompts(&model, &dir);
}

#[test]
fn tiny_qwen2_with_biases_and_untied_head() {
    let dir = fixture("tiny-qwen2");
    let model = Model::load(&dir).unwrap();
    let c = &model.config;
    assert_eq!(c.architecture, Architecture::Qwen2);
    let attention = model.definition().attention().clone();
    assert!(attention.qkv_bias && attention.qk_norm.is_none() && !c.tie_word_embeddings);
    assert_eq!(c.rope.theta, 1_000_000.0);
    assert_eq!(c.rope.scaling, RopeScaling::None);
    assert_eq!(c.head_dim, 16);
    let bias = model
        .weights
        .to_f32("model.layers.1.self_attn.k_proj.bias", &[32])
        .unwrap();
    assert!(bias.len() == 32 && bias.iter().all(|v| v.is_finite()));
    assert_eq!(
        model.weights.tensor("lm_head.weight").unwrap().shape,
        vec![1024, 96]
    );
    // generation_config's EOS plus the tokenizer's `<|im_end|>` (the same id here).
    assert_eq!(model.eos_token_ids(), vec![7]);
    check_golden_prompts(&model, &dir);
}

#[test]
fn tiny_qwen3_with_qk_norm_and_jinja_template() {
    let dir = fixture("tiny-qwen3");
    let model = Model::load(&dir).unwrap();
    let c = &model.config;
    assert_eq!(c.architecture, Architecture::Qwen3);
    let attention = model.definition().attention().clone();
    assert!(attention.qk_norm.is_some() && !attention.qkv_bias);
    assert_eq!(
        (c.hidden_size / c.num_attention_heads, c.head_dim),
        (16, 32)
    );
    assert_eq!(
        model
            .weights
            .tensor("model.layers.0.self_attn.q_norm.weight")
            .unwrap()
            .shape,
        vec![32]
    );
    check_golden_prompts(&model, &dir);

    // The template comes from chat_template.jinja and honours `enable_thinking`.
    let template = model.chat_template.as_ref().unwrap();
    let messages = [json!({"role": "user", "content": "Hi"})];
    let mut extra = Map::new();
    extra.insert("enable_thinking".into(), json!(false));
    let prompt = template.render(&messages, None, true, &extra).unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
}
