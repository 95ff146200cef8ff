//! End-to-end tests of the OpenAI API: the real server, in-process on 127.0.0.1:0, with the real
//! embedded model and engine on the CPU backend, driven over TLS (HTTP/2 and HTTP/1.1) by reqwest
//! trusting the server's generated certificate. Expected texts come from the transformers
//! reference outputs committed with the model (`tests/fixtures/inferno-tiny/golden.json`).

mod server_support;

use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use inferno::config::Config;
use inferno::model::EMBEDDED_MODEL_NAME as MODEL;
use inferno::server::Server;
use reqwest::StatusCode;
use serde_json::{Value, json};
use server_support::{ALICE, BOB, Harness, base_config, expect_error, json_of, runtime};
/// The end-of-turn token as the reference decoded it; generation stops there.
const EOT: &str = "<|eot_id|>";

fn golden() -> &'static Value {
    static GOLDEN: OnceLock<Value> = OnceLock::new();
    GOLDEN.get_or_init(|| {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/inferno-tiny/golden.json");
        let text = std::fs::read_to_string(&path).expect("golden.json is readable");
        serde_json::from_str(&text).expect("golden.json is JSON")
    })
}

/// A golden case: its input, the reference's greedy text up to the end-of-turn token, and the
/// prompt length.
fn case(index: usize, kind: &str) -> (Value, String, usize) {
    let case = &golden()["cases"][index];
    assert_eq!(case["kind"], kind);
    let text = case["greedy_text"].as_str().expect("greedy_text");
    let answer = &text[..text.find(EOT).expect("the reference stops at EOT")];
    (
        case["input"].clone(),
        answer.to_owned(),
        case["input_ids"].as_array().expect("input_ids").len(),
    )
}

fn main_server() -> &'static Harness {
    static SERVER: OnceLock<Harness> = OnceLock::new();
    SERVER.get_or_init(|| Harness::start(base_config(), true))
}

async fn read_sse(mut response: reqwest::Response) -> (Vec<Value>, bool) {
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"],
        "text/event-stream",
        "content type"
    );
    let mut raw = Vec::new();
    while let Some(chunk) = response.chunk().await.expect("stream chunk") {
        raw.extend_from_slice(&chunk);
    }
    let text = String::from_utf8(raw).expect("UTF-8 stream");
    let mut events = Vec::new();
    let mut done = false;
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let data = block.strip_prefix("data: ").expect("data line");
        assert!(!done, "event after [DONE]: {data}");
        if data == "[DONE]" {
            done = true;
        } else {
            events.push(serde_json::from_str(data).expect("event JSON"));
        }
    }
    (events, done)
}

#[tokio::test]
async fn chat_greedy_matches_transformers() {
    let server = main_server();
    let (messages, expected, prompt_len) = case(0, "chat");
    let response = server
        .post(
            "/v1/chat/completions",
            ALICE,
            &json!({"model": MODEL, "messages": messages, "temperature": 0, "max_tokens": 24}),
        )
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    let body = json_of(response).await;
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], MODEL);
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let choice = &body["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], expected.as_str());
    assert_eq!(choice["finish_reason"], "stop");
    // Ended by the end-of-turn token, not by a stop string or stop token of the request.
    assert_eq!(choice.get("stop_reason"), Some(&Value::Null));
    assert_eq!(body["usage"]["prompt_tokens"], prompt_len);
    let completion = body["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((16..=17).contains(&completion), "{completion} tokens");
    assert_eq!(
        body["usage"]["total_tokens"].as_u64().unwrap(),
        prompt_len as u64 + completion
    );
}

#[tokio::test]
async fn chat_stream_matches_transformers_and_ends_with_done() {
    let server = main_server();
    let (messages, expected, prompt_len) = case(1, "chat");
    let response = server
        .post(
            "/v1/chat/completions",
            BOB,
            &json!({"model": MODEL, "messages": messages, "temperature": 0, "max_tokens": 24,
                    "stream": true, "stream_options": {"include_usage": true}}),
        )
        .send()
        .await
        .expect("request");
    let (events, done) = read_sse(response).await;
    assert!(done, "stream must end with data: [DONE]");
    assert_eq!(events[0]["object"], "chat.completion.chunk");
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let id = events[0]["id"].clone();
    let mut text = String::new();
    let mut finish = None;
    for event in &events {
        assert_eq!(event["id"], id);
        if let Some(choice) = event["choices"].get(0) {
            if let Some(content) = choice["delta"]["content"].as_str() {
                text.push_str(content);
            }
            if let Some(reason) = choice["finish_reason"].as_str() {
                finish = Some(reason.to_owned());
            }
        }
    }
    assert_eq!(text, expected);
    assert_eq!(finish.as_deref(), Some("stop"));
    let last = events.last().expect("usage chunk");
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["prompt_tokens"], prompt_len);
    assert!(last["usage"]["completion_tokens"].as_u64().unwrap() >= 16);
}

#[tokio::test]
async fn completion_greedy_matches_transformers_over_http1() {
    let server = main_server();
    let (prompt, expected, prompt_len) = case(3, "raw");
    let client = server
        .client_builder()
        .http1_only()
        .build()
        .expect("client");
    let response = client
        .post(server.url("/v1/completions"))
        .bearer_auth(ALICE)
        .json(&json!({"model": MODEL, "prompt": prompt, "temperature": 0,
                      "max_tokens": 24, "logprobs": 2}))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.version(), reqwest::Version::HTTP_11);
    let body = json_of(response).await;
    assert_eq!(body["object"], "text_completion");
    let choice = &body["choices"][0];
    assert_eq!(choice["text"], expected.as_str());
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(body["usage"]["prompt_tokens"], prompt_len);
    let logprobs = &choice["logprobs"];
    let tokens: Vec<&str> = logprobs["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert!(tokens.len() >= 16, "{tokens:?}");
    assert!(tokens.concat().starts_with(&expected), "{tokens:?}");
    assert_eq!(logprobs["top_logprobs"][0].as_object().unwrap().len(), 2);
    assert_eq!(logprobs["text_offset"][0], 0);
    let first = logprobs["token_logprobs"][0].as_f64().unwrap();
    assert!(first <= 0.0, "a log-probability: {first}");
}

#[tokio::test]
async fn completion_stream_with_token_prompt() {
    let server = main_server();
    let (_, expected, _) = case(3, "raw");
    let ids = golden()["cases"][3]["input_ids"].clone();
    let response = server
        .post(
            "/v1/completions",
            ALICE,
            &json!({"model": MODEL, "prompt": ids, "temperature": 0, "max_tokens": 24,
                    "stream": true}),
        )
        .send()
        .await
        .expect("request");
    let (events, done) = read_sse(response).await;
    assert!(done);
    let text: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, expected);
    assert!(events.iter().all(|e| e.get("usage").is_none()));
}

#[tokio::test]
async fn n_choices_with_seed_are_reproducible() {
    let server = main_server();
    let request = json!({"model": MODEL, "prompt": "Once upon a time", "n": 2, "seed": 11,
                         "temperature": 1.0, "max_tokens": 8, "ignore_eos": true});
    let first = json_of(
        server
            .post("/v1/completions", ALICE, &request)
            .send()
            .await
            .unwrap(),
    )
    .await;
    let second = json_of(
        server
            .post("/v1/completions", BOB, &request)
            .send()
            .await
            .unwrap(),
    )
    .await;
    let choices = first["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    let indices: Vec<_> = choices
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indices, vec![0, 1]);
    assert_eq!(first["usage"]["completion_tokens"], 16);
    assert_eq!(
        first["choices"], second["choices"],
        "same seed, same choices"
    );
}

#[tokio::test]
async fn stop_string_ends_generation_and_is_not_emitted() {
    let server = main_server();
    let (prompt, full, _) = case(3, "raw");
    let stop = full.split_whitespace().nth(3).expect("a fourth word");
    let expected = &full[..full.find(stop).expect("stop occurs")];
    let body = json_of(
        server
            .post(
                "/v1/completions",
                ALICE,
                &json!({"model": MODEL, "prompt": prompt, "temperature": 0,
                        "max_tokens": 24, "stop": [stop, "never-seen"]}),
            )
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(body["choices"][0]["text"], expected);
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(body["choices"][0]["stop_reason"], stop);

    // A stop token id, streamed: the last chunk names the token; earlier chunks carry null.
    let tokenized = json_of(
        server
            .post(
                "/tokenize",
                ALICE,
                &json!({"model": MODEL, "prompt": full, "add_special_tokens": false}),
            )
            .send()
            .await
            .unwrap(),
    )
    .await;
    let ids: Vec<u64> = tokenized["tokens"]
        .as_array()
        .expect("token ids")
        .iter()
        .map(|id| id.as_u64().expect("an id"))
        .collect();
    let at = (1..ids.len())
        .find(|&i| !ids[..i].contains(&ids[i]))
        .expect("a token not seen before it");
    let response = server
        .post(
            "/v1/completions",
            ALICE,
            &json!({"model": MODEL, "prompt": prompt, "temperature": 0, "max_tokens": 24,
                    "stream": true, "stop_token_ids": [ids[at]]}),
        )
        .send()
        .await
        .unwrap();
    let (events, done) = read_sse(response).await;
    assert!(done);
    let choices: Vec<&Value> = events.iter().filter_map(|e| e["choices"].get(0)).collect();
    let (last, earlier) = choices.split_last().expect("chunks");
    assert_eq!(last["finish_reason"], "stop");
    assert_eq!(last["stop_reason"], ids[at]);
    assert!(earlier.iter().all(|c| c["stop_reason"].is_null()));
}

#[tokio::test]
async fn models_lists_the_model_with_its_digest() {
    let server = main_server();
    let response = server
        .client()
        .get(server.url("/v1/models"))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = json_of(response).await;
    assert_eq!(body["object"], "list");
    assert_eq!(body["data"][0]["id"], MODEL);
    let digest = body["data"][0]["digest"].as_str().unwrap();
    assert_eq!(digest.len(), 64);
    assert!(digest.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(body["data"][0]["max_model_len"], 2048);

    let one = server
        .client()
        .get(server.url(&format!("/v1/models/{MODEL}")))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(one.status(), StatusCode::OK);
    assert_eq!(json_of(one).await, body["data"][0]);
    let other = server
        .client()
        .get(server.url("/v1/models/gpt-9"))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    let error = expect_error(other, StatusCode::NOT_FOUND).await;
    assert_eq!(error["code"], "model_not_found");
}

#[tokio::test]
async fn health_metrics_and_request_ids() {
    let server = main_server();
    let client = server.client();
    let health = client.get(server.url("/health")).send().await.unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    let generated = health.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(generated.len(), 36, "a generated UUID: {generated}");

    let echoed = client
        .get(server.url("/health"))
        .header("x-request-id", "trace-42")
        .send()
        .await
        .unwrap();
    // The client's id comes back beside the server's own (issue 14, defect 2).
    assert_eq!(echoed.headers()["x-client-request-id"], "trace-42");
    let server_id = echoed.headers()["x-request-id"].to_str().unwrap();
    assert_eq!(server_id.len(), 36, "a generated UUID: {server_id}");
    assert_ne!(server_id, generated);

    // One request so the counters have something to show.
    let ok = server
        .post(
            "/v1/completions",
            BOB,
            &json!({"model": MODEL, "prompt": "metrics", "max_tokens": 2, "temperature": 0}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), StatusCode::OK);

    let anonymous = client.get(server.url("/metrics")).send().await.unwrap();
    expect_error(anonymous, StatusCode::UNAUTHORIZED).await;
    let metrics = client
        .get(server.url("/metrics"))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(metrics.status(), StatusCode::OK);
    let text = metrics.text().await.unwrap();
    for name in [
        "vllm:num_requests_running{model_name=\"inferno-tiny\"}",
        "vllm:num_requests_waiting{model_name=\"inferno-tiny\"}",
        "vllm:kv_cache_usage_perc{model_name=\"inferno-tiny\"}",
        "vllm:prefix_cache_queries_total{model_name=\"inferno-tiny\"}",
        "vllm:prefix_cache_hits_total{model_name=\"inferno-tiny\"}",
        "vllm:prompt_tokens_total{model_name=\"inferno-tiny\"}",
        "vllm:generation_tokens_total{model_name=\"inferno-tiny\"}",
        "vllm:time_to_first_token_seconds_bucket{",
        "vllm:inter_token_latency_seconds_bucket{",
        "vllm:e2e_request_latency_seconds_bucket{",
        "inferno:api_requests_total{",
    ] {
        assert!(text.contains(name), "missing {name} in\n{text}");
    }
    // Another principal's name is not shown to an API key (only to the scrape key).
    assert!(!text.contains("principal="), "{text}");
}

#[tokio::test]
async fn auth_is_required_and_checked() {
    let server = main_server();
    let body = json!({"model": MODEL, "prompt": "x", "max_tokens": 1});
    let missing = server
        .client()
        .post(server.url("/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(missing.headers()["www-authenticate"], "Bearer");
    let error = expect_error(missing, StatusCode::UNAUTHORIZED).await;
    assert_eq!(error["code"], "invalid_api_key");
    let wrong = server
        .post("/v1/completions", "not-a-key", &body)
        .send()
        .await
        .unwrap();
    expect_error(wrong, StatusCode::UNAUTHORIZED).await;
    let models = server
        .client()
        .get(server.url("/v1/models"))
        .send()
        .await
        .unwrap();
    expect_error(models, StatusCode::UNAUTHORIZED).await;
}

#[tokio::test]
async fn bad_requests_get_openai_errors() {
    let server = main_server();
    let client = server.client();
    let raw = |body: &'static str| {
        client
            .post(server.url("/v1/chat/completions"))
            .bearer_auth(ALICE)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    expect_error(raw("{\"model\":").await.unwrap(), StatusCode::BAD_REQUEST).await;
    let error = expect_error(
        raw(r#"{"model":"inferno-tiny","messages":[{"role":"user","content":"x"}],"temperature":"hot"}"#)
            .await
            .unwrap(),
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert_eq!(error["param"], "temperature");
    let error = expect_error(
        raw(r#"{"model":"inferno-tiny","messages":[]}"#)
            .await
            .unwrap(),
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert_eq!(error["param"], "messages");
    let error = expect_error(
        raw(r#"{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}"#)
            .await
            .unwrap(),
        StatusCode::NOT_FOUND,
    )
    .await;
    assert_eq!(error["code"], "model_not_found");

    let over_limit = server
        .post(
            "/v1/completions",
            ALICE,
            &json!({"model": MODEL, "prompt": "x", "max_tokens": 1_000_000}),
        )
        .send()
        .await
        .unwrap();
    let error = expect_error(over_limit, StatusCode::BAD_REQUEST).await;
    assert_eq!(error["param"], "max_tokens");

    let over_context = server
        .post(
            "/v1/completions",
            ALICE,
            &json!({"model": MODEL, "prompt": "x", "max_tokens": 2047}),
        )
        .send()
        .await
        .unwrap();
    let error = expect_error(over_context, StatusCode::BAD_REQUEST).await;
    assert_eq!(error["code"], "context_length_exceeded");

    let long_prompt = "hello ".repeat(5000);
    let too_long = server
        .post(
            "/v1/chat/completions",
            ALICE,
            &json!({"model": MODEL, "messages": [{"role": "user", "content": long_prompt}]}),
        )
        .send()
        .await
        .unwrap();
    let error = expect_error(too_long, StatusCode::BAD_REQUEST).await;
    assert_eq!(error["code"], "context_length_exceeded");

    let huge = "x".repeat(300 << 10);
    let too_big = server
        .post(
            "/v1/completions",
            ALICE,
            &json!({"model": MODEL, "prompt": huge}),
        )
        .send()
        .await
        .unwrap();
    expect_error(too_big, StatusCode::PAYLOAD_TOO_LARGE).await;

    let unknown = client
        .get(server.url("/v1/nothing-here"))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    expect_error(unknown, StatusCode::NOT_FOUND).await;
    let wrong_method = client
        .get(server.url("/v1/chat/completions"))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_method.headers()["allow"], "POST");
    expect_error(wrong_method, StatusCode::METHOD_NOT_ALLOWED).await;
}

#[tokio::test]
async fn health_is_503_until_the_model_is_loaded() {
    let server = Harness::start(base_config(), false);
    let client = server.client();
    let health = client.get(server.url("/health")).send().await.unwrap();
    assert_eq!(health.status(), StatusCode::SERVICE_UNAVAILABLE);
    let chat = server
        .post(
            "/v1/chat/completions",
            ALICE,
            &json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}),
        )
        .send()
        .await
        .unwrap();
    expect_error(chat, StatusCode::SERVICE_UNAVAILABLE).await;
}

#[test]
fn no_keys_refuses_a_public_listen_address() {
    // The development policy does not require keys; the public address alone is refused.
    let mut config = Config {
        attestation: inferno::config::AttestationConfig::development(),
        ..Config::default()
    };
    config.server.listen = "0.0.0.0:0".parse().unwrap();
    let err = runtime()
        .block_on(Server::start(config))
        .err()
        .expect("must refuse");
    assert!(matches!(
        err,
        inferno::server::ServerError::NoKeysOffLoopback(_)
    ));
    assert!(err.to_string().contains("without API keys"), "{err}");
}

/// Waits until the engine holds no sequences and no KV blocks.
async fn wait_until_idle(harness: &Harness) -> inferno::engine::EngineStats {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stats = harness.app.service().expect("loaded").engine().stats();
        if stats.running == 0 && stats.waiting == 0 && stats.kv_blocks_used == 0 {
            return stats;
        }
        assert!(
            Instant::now() < deadline,
            "engine still busy after disconnects: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn queue_full_gives_429_and_disconnects_free_kv_blocks() {
    let mut config = base_config();
    config.engine.max_num_seqs = Some(1);
    config.engine.max_waiting = 1;
    config.limits.retry_after_secs = 3;
    let server = Harness::start(config, true);
    let long = json!({"model": MODEL, "prompt": "Tell me a long story", "max_tokens": 1900,
                      "ignore_eos": true, "stream": true, "temperature": 0});

    // A stream that has produced a token holds KV blocks; dropping it must free them, and
    // generation must stop well before its 1900 tokens (one decode step per token).
    let steps_before = server.app.service().unwrap().engine().stats().steps;
    let mut first = server
        .post("/v1/completions", ALICE, &long)
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let chunk = first.chunk().await.unwrap().expect("a first event");
    assert!(chunk.starts_with(b"data: "));
    // The engine publishes its statistics after each step, so the snapshot may trail the
    // token just received by a step.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let busy = server.app.service().unwrap().engine().stats();
        if busy.kv_blocks_used > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a running request holds blocks: {busy:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(first);
    let idle = wait_until_idle(&server).await;
    assert!(
        idle.steps - steps_before < 1000,
        "generation was not cancelled: {} steps",
        idle.steps - steps_before
    );

    // Fill the running slot and the queue, then expect a 429 with Retry-After.
    let mut held = Vec::new();
    let mut refused = None;
    for _ in 0..6 {
        let response = server
            .post("/v1/completions", BOB, &long)
            .send()
            .await
            .unwrap();
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            refused = Some(response);
            break;
        }
        assert_eq!(response.status(), StatusCode::OK);
        held.push(response);
    }
    let refused = refused.expect("a request beyond the queue is refused");
    assert_eq!(refused.headers()["retry-after"], "3");
    let error = expect_error(refused, StatusCode::TOO_MANY_REQUESTS).await;
    assert_eq!(error["type"], "rate_limit_error");
    assert!(
        held.len() <= 3,
        "at most running + waiting held: {}",
        held.len()
    );
    drop(held);
    wait_until_idle(&server).await;
}

#[tokio::test]
async fn chat_logprobs_and_streamed_choices() {
    let server = main_server();
    let (messages, expected, _) = case(0, "chat");
    let body = json_of(
        server
            .post(
                "/v1/chat/completions",
                ALICE,
                &json!({"model": MODEL, "messages": messages, "temperature": 0,
                        "max_completion_tokens": 24, "logprobs": true, "top_logprobs": 3}),
            )
            .send()
            .await
            .unwrap(),
    )
    .await;
    let content = body["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("logprobs.content");
    assert!(content.len() >= 16);
    let tokens: String = content
        .iter()
        .map(|t| t["token"].as_str().unwrap())
        .collect();
    assert!(tokens.starts_with(&expected), "{tokens:?}");
    for token in content {
        assert!(token["logprob"].as_f64().unwrap() <= 0.0);
        let top = token["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy decoding picks the most likely token.
        assert_eq!(top[0]["token"], token["token"]);
    }

    let response = server
        .post(
            "/v1/chat/completions",
            BOB,
            &json!({"model": MODEL, "messages": messages, "temperature": 0, "n": 2,
                    "max_tokens": 24, "stream": true}),
        )
        .send()
        .await
        .unwrap();
    let (events, done) = read_sse(response).await;
    assert!(done);
    for index in 0..2 {
        let text: String = events
            .iter()
            .filter(|e| e["choices"][0]["index"] == index)
            .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, expected, "choice {index}");
    }
}
