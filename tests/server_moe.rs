//! Mixture-of-experts models through the OpenAI API: the real server over TLS with the tiny
//! Qwen3-MoE, Qwen2-MoE, Mixtral and gpt-oss fixtures on the CPU backend, greedy, against
//! transformers' greedy continuations of the ten golden prompts (`scripts/make_moe_fixtures.py`,
//! `scripts/make_gptoss_fixture.py`).

mod server_support;

use inferno::model::Model;
use reqwest::StatusCode;
use serde_json::{Value, json};
use server_support::{ALICE, Harness, base_config, json_of};

/// Each prompt of `name`'s golden file, greedy for as many tokens as transformers produced (the
/// end of turn ignored): the completion holds exactly those tokens, decoded as the server streams
/// text (special tokens skipped).
async fn greedy_through_the_api(name: &str) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let golden: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap();
    let model = Model::load(&dir).expect("fixture loads");
    let server = Harness::start_serving(base_config(), model);
    let cases = golden["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 10, "{name}: ten prompts");
    for (i, case) in cases.iter().enumerate() {
        let tokens = case["greedy_24"].as_array().unwrap().len();
        let common = json!({"model": name, "temperature": 0, "max_tokens": tokens,
                            "ignore_eos": true});
        let (path, mut body) = match case["kind"].as_str().unwrap() {
            "chat" => ("/v1/chat/completions", json!({"messages": case["input"]})),
            _ => ("/v1/completions", json!({"prompt": case["input"]})),
        };
        for (key, value) in common.as_object().unwrap() {
            body[key] = value.clone();
        }
        let response = server
            .post(path, ALICE, &body)
            .send()
            .await
            .expect("request");
        assert_eq!(response.status(), StatusCode::OK, "{name}: case {i}");
        let body = json_of(response).await;
        let choice = &body["choices"][0];
        let text = choice["message"]["content"]
            .as_str()
            .or_else(|| choice["text"].as_str())
            .expect("a completion");
        assert_eq!(
            text,
            case["greedy_text_skip_special"].as_str().unwrap(),
            "{name}: case {i}"
        );
        assert_eq!(
            body["usage"]["completion_tokens"], tokens,
            "{name}: case {i}"
        );
        assert_eq!(
            body["usage"]["prompt_tokens"],
            case["input_ids"].as_array().unwrap().len(),
            "{name}: case {i}: the prompt as transformers tokenized it"
        );
    }
}

#[tokio::test]
async fn qwen3_moe_greedy_outputs_equal_transformers() {
    greedy_through_the_api("tiny-qwen3-moe").await;
}

#[tokio::test]
async fn qwen2_moe_greedy_outputs_equal_transformers() {
    greedy_through_the_api("tiny-qwen2-moe").await;
}

#[tokio::test]
async fn mixtral_greedy_outputs_equal_transformers() {
    greedy_through_the_api("tiny-mixtral").await;
}

/// gpt-oss with MXFP4 experts: every prompt runs past the 8-position window of its sliding
/// layers, so the window, the sinks and the freed sliding blocks are all on the path.
#[tokio::test]
async fn gpt_oss_greedy_outputs_equal_transformers() {
    greedy_through_the_api("tiny-gpt-oss").await;
}

/// gpt-oss with the experts in the bf16 layout transformers saves.
#[tokio::test]
async fn gpt_oss_bf16_greedy_outputs_equal_transformers() {
    greedy_through_the_api("tiny-gpt-oss-bf16").await;
}
