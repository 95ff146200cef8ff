//! `echo` and `prompt_logprobs` on `/v1/completions`, on the embedded model and the CPU backend.

mod server_support;

use inferno::model::EMBEDDED_MODEL_NAME as MODEL;
use reqwest::StatusCode;
use serde_json::{Value, json};
use server_support::{ALICE, Harness, base_config, expect_error, json_of, runtime};

fn harness() -> Harness {
    Harness::start(base_config(), true)
}

#[test]
fn echo_returns_the_prompt_and_its_logprobs_first_null() {
    let harness = harness();
    runtime().block_on(async {
        let prompt = [9u32, 120, 45, 300, 77, 12];
        let plain = json_of(
            harness
                .post(
                    "/v1/completions",
                    ALICE,
                    &json!({"model": MODEL, "prompt": prompt, "max_tokens": 3, "temperature": 0,
                            "logprobs": 2}),
                )
                .send()
                .await
                .unwrap(),
        )
        .await;
        let echoed = json_of(
            harness
                .post(
                    "/v1/completions",
                    ALICE,
                    &json!({"model": MODEL, "prompt": prompt, "max_tokens": 3, "temperature": 0,
                            "logprobs": 2, "echo": true, "prompt_logprobs": 1}),
                )
                .send()
                .await
                .unwrap(),
        )
        .await;
        let (plain, echoed) = (&plain["choices"][0], &echoed["choices"][0]);
        let lp = &echoed["logprobs"];
        let tokens = lp["tokens"].as_array().unwrap();
        let token_logprobs = lp["token_logprobs"].as_array().unwrap();
        let top = lp["top_logprobs"].as_array().unwrap();
        assert_eq!(tokens.len(), prompt.len() + 3);
        assert_eq!(token_logprobs[0], Value::Null);
        assert_eq!(top[0], Value::Null);
        assert!(
            token_logprobs[1..]
                .iter()
                .all(|l| l.as_f64().unwrap() <= 0.0)
        );
        assert!(top[1..].iter().all(|t| t.as_object().unwrap().len() <= 2));
        // The prompt's text precedes the completion, which is the plain one, with its logprobs.
        // Token ids without special tokens: their texts are the echoed prompt.
        let prompt_text: String = tokens[..prompt.len()]
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        let text = echoed["text"].as_str().unwrap();
        assert_eq!(
            text,
            format!("{prompt_text}{}", plain["text"].as_str().unwrap())
        );
        assert_eq!(
            &token_logprobs[prompt.len()..],
            plain["logprobs"]["token_logprobs"]
                .as_array()
                .unwrap()
                .as_slice()
        );
        assert_eq!(lp["text_offset"][prompt.len()], json!(prompt_text.len()));
        // vLLM's prompt_logprobs: the first null, then the prompt token with its rank and
        // decoded text, and the most likely alternative.
        let vllm = echoed["prompt_logprobs"].as_array().unwrap();
        assert_eq!(vllm.len(), prompt.len());
        assert_eq!(vllm[0], Value::Null);
        for (i, entry) in vllm.iter().enumerate().skip(1) {
            let entry = entry.as_object().unwrap();
            let own = &entry[&prompt[i].to_string()];
            let (a, b) = (
                own["logprob"].as_f64().unwrap(),
                token_logprobs[i].as_f64().unwrap(),
            );
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
            assert!(own["rank"].as_u64().unwrap() >= 1);
            assert_eq!(own["decoded_token"], tokens[i]);
            assert!(entry.values().any(|e| e["rank"] == json!(1)));
        }
        // The plain response carries no prompt_logprobs key.
        assert!(plain.get("prompt_logprobs").is_none());
    });
}

#[test]
fn echo_and_prompt_logprobs_are_refused_when_streaming() {
    let harness = harness();
    runtime().block_on(async {
        for (field, value) in [("echo", json!(true)), ("prompt_logprobs", json!(1))] {
            let mut body = json!({"model": MODEL, "prompt": "Hello", "max_tokens": 2,
                                  "stream": true});
            body[field] = value;
            let response = harness
                .post("/v1/completions", ALICE, &body)
                .send()
                .await
                .unwrap();
            let error = expect_error(response, StatusCode::BAD_REQUEST).await;
            assert_eq!(error["param"], field, "{error}");
        }
    });
}
