//! Structured outputs, tool calls, logit bias and the tokenizer endpoints, end to end on the
//! real server with the embedded tiny model on the CPU backend. Its random weights produce
//! garbage unless constrained, so output that parses and validates shows the grammar did the
//! work.

mod server_support;

use std::sync::OnceLock;

use inferno::model::EMBEDDED_MODEL_NAME as MODEL;
use inferno::server::openai::tools::ToolCallFormat;
use reqwest::StatusCode;
use serde_json::{Value, json};
use server_support::{ALICE, Harness, base_config, expect_error, json_of};

fn server() -> &'static Harness {
    static SERVER: OnceLock<Harness> = OnceLock::new();
    SERVER.get_or_init(|| {
        let mut config = base_config();
        // The embedded template shows no tool-call markers: the configuration names the format.
        config.server.tool_call_parser = Some(ToolCallFormat::Hermes);
        Harness::start(config, true)
    })
}

/// Checks `value` against the subset of JSON Schema the tests use: type, properties, required,
/// additionalProperties false, enum, const, items, minItems/maxItems, minimum/maximum,
/// maxLength, anyOf.
fn validate(value: &Value, schema: &Value, path: &str) -> Result<(), String> {
    let fail = |what: &str| Err(format!("{path}: {what} (value {value})"));
    if let Some(options) = schema.get("anyOf").and_then(Value::as_array) {
        return match options.iter().any(|s| validate(value, s, path).is_ok()) {
            true => Ok(()),
            false => fail("matches no anyOf branch"),
        };
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        return fail("not in enum");
    }
    if let Some(constant) = schema.get("const")
        && constant != value
    {
        return fail("not the const");
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => {
            let Some(object) = value.as_object() else {
                return fail("not an object");
            };
            let properties = schema.get("properties").and_then(Value::as_object);
            for key in schema["required"].as_array().into_iter().flatten() {
                if !object.contains_key(key.as_str().unwrap_or_default()) {
                    return fail(&format!("missing required {key}"));
                }
            }
            for (key, item) in object {
                match properties.and_then(|p| p.get(key)) {
                    Some(sub) => validate(item, sub, &format!("{path}.{key}"))?,
                    None if schema["additionalProperties"] == false => {
                        return fail(&format!("unexpected key {key}"));
                    }
                    None => {}
                }
            }
        }
        Some("array") => {
            let Some(items) = value.as_array() else {
                return fail("not an array");
            };
            if schema["minItems"]
                .as_u64()
                .is_some_and(|n| (items.len() as u64) < n)
                || schema["maxItems"]
                    .as_u64()
                    .is_some_and(|n| items.len() as u64 > n)
            {
                return fail("wrong number of items");
            }
            for (i, item) in items.iter().enumerate() {
                validate(item, &schema["items"], &format!("{path}[{i}]"))?;
            }
        }
        Some("string") => {
            let Some(text) = value.as_str() else {
                return fail("not a string");
            };
            if schema["maxLength"]
                .as_u64()
                .is_some_and(|n| text.chars().count() as u64 > n)
            {
                return fail("too long");
            }
        }
        Some(kind @ ("integer" | "number")) => {
            let Some(number) = value.as_f64() else {
                return fail("not a number");
            };
            if kind == "integer" && !(value.is_i64() || value.is_u64()) {
                return fail("not an integer");
            }
            if schema["minimum"].as_f64().is_some_and(|m| number < m)
                || schema["maximum"].as_f64().is_some_and(|m| number > m)
            {
                return fail("out of bounds");
            }
        }
        Some("boolean") if !value.is_boolean() => return fail("not a boolean"),
        _ => {}
    }
    Ok(())
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "role": {"enum": ["admin", "user", "guest"]},
            "scores": {"type": "array", "items": {"type": "number", "minimum": -1, "maximum": 1}, "maxItems": 3},
            "address": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 6},
                    "zip": {"type": "integer", "minimum": 1000, "maximum": 99999}
                },
                "required": ["city", "zip"],
                "additionalProperties": false
            }
        },
        "required": ["name", "age", "role", "scores", "address"],
        "additionalProperties": false
    })
}

async fn chat(body: Value) -> Value {
    let response = server()
        .post("/v1/chat/completions", ALICE, &body)
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), StatusCode::OK);
    json_of(response).await
}

fn messages() -> Value {
    json!([{"role": "user", "content": "Describe a person as JSON."}])
}

#[tokio::test]
async fn json_schema_output_validates() {
    let schema = person_schema();
    for seed in [1, 2, 3] {
        let body = chat(json!({
            "model": MODEL, "messages": messages(), "max_tokens": 300, "temperature": 1.0,
            "seed": seed,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "person", "schema": schema, "strict": true}}
        }))
        .await;
        let choice = &body["choices"][0];
        assert_eq!(choice["finish_reason"], "stop", "{body}");
        let text = choice["message"]["content"].as_str().expect("content");
        let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        validate(&value, &schema, "$").unwrap();
    }
}

#[tokio::test]
async fn json_object_regex_and_choice_hold() {
    // Any object is allowed, so free strings could run to max_tokens; biases toward `"` and `}`
    // keep it short. Alone they would give `"}"}…`: the grammar makes it an object.
    let mut bias = serde_json::Map::new();
    for piece in ["\"", "}"] {
        let response = server()
            .post(
                "/tokenize",
                ALICE,
                &json!({"prompt": piece, "add_special_tokens": false}),
            )
            .send()
            .await
            .expect("request");
        let token = json_of(response).await["tokens"][0].as_u64().unwrap();
        bias.insert(token.to_string(), json!(10));
    }
    let body = chat(json!({
        "model": MODEL, "messages": messages(), "max_tokens": 200, "temperature": 0,
        "response_format": {"type": "json_object"}, "logit_bias": bias
    }))
    .await;
    let text = body["choices"][0]["message"]["content"].as_str().unwrap();
    let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    assert!(value.is_object(), "{text}");

    let body = chat(json!({
        "model": MODEL, "messages": messages(), "max_tokens": 40, "temperature": 1.0, "seed": 5,
        "guided_regex": "[A-Z][a-z]{2,6}-[0-9]{3}"
    }))
    .await;
    let text = body["choices"][0]["message"]["content"].as_str().unwrap();
    let (word, digits) = text.split_once('-').unwrap_or_else(|| panic!("{text:?}"));
    assert!(word.len() >= 3 && word.len() <= 7, "{text:?}");
    assert!(
        word.chars().next().unwrap().is_ascii_uppercase(),
        "{text:?}"
    );
    assert!(
        word.chars().skip(1).all(|c| c.is_ascii_lowercase()),
        "{text:?}"
    );
    assert!(
        digits.len() == 3 && digits.chars().all(|c| c.is_ascii_digit()),
        "{text:?}"
    );

    let choices = ["alpha", "beta", "gamma delta"];
    for seed in 0..4 {
        let response = server()
            .post(
                "/v1/completions",
                ALICE,
                &json!({"model": MODEL, "prompt": "Pick:", "max_tokens": 20, "temperature": 1.0,
                        "seed": seed, "guided_choice": choices}),
            )
            .send()
            .await
            .expect("request");
        let body = json_of(response).await;
        let text = body["choices"][0]["text"].as_str().unwrap();
        assert!(choices.contains(&text), "{text:?}");
    }
}

#[tokio::test]
async fn invalid_constraints_are_a_400_naming_the_field() {
    for (field, value) in [
        ("guided_regex", json!("(unclosed")),
        ("guided_grammar", json!("start: undefined_rule")),
        (
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}),
        ),
    ] {
        let mut body = json!({"model": MODEL, "messages": messages(), "max_tokens": 5});
        body[field] = value;
        let response = server()
            .post("/v1/chat/completions", ALICE, &body)
            .send()
            .await
            .expect("request");
        let error = expect_error(response, StatusCode::BAD_REQUEST).await;
        assert_eq!(error["param"], field, "{error}");
    }
    let response = server()
        .post(
            "/v1/chat/completions",
            ALICE,
            &json!({"model": MODEL, "messages": messages(), "functions": []}),
        )
        .send()
        .await
        .expect("request");
    let error = expect_error(response, StatusCode::BAD_REQUEST).await;
    assert_eq!(error["param"], "functions");
}

/// Issue 47, defect 8: costly constraints are refused before they are compiled, with a 400
/// naming the field and no parser state; an invalid `guided_json` names `guided_json`.
#[tokio::test]
async fn costly_constraints_are_refused_before_compiling_naming_the_field() {
    // Over the 1,024-choice limit (the whole body within the harness's 256 KiB).
    let choices: Vec<String> = (0..2_000).map(|i| format!("choice number {i}")).collect();
    for (field, value) in [
        ("guided_regex", json!("([a-z]{0,200}[0-9]{0,200}){0,200}")),
        ("guided_choice", json!(choices)),
        (
            "guided_grammar",
            json!(format!("start: \"{}\"", "a".repeat(70_000))),
        ),
        ("guided_json", json!({"type": "no-such-type"})),
    ] {
        let mut body = json!({"model": MODEL, "messages": messages(), "max_tokens": 5});
        body[field] = value;
        let started = std::time::Instant::now();
        let response = server()
            .post("/v1/chat/completions", ALICE, &body)
            .send()
            .await
            .expect("request");
        let error = expect_error(response, StatusCode::BAD_REQUEST).await;
        assert_eq!(error["param"], field, "{error}");
        let message = error["message"].as_str().expect("message");
        assert!(!message.contains('\n'), "{message}");
        assert!(message.len() < 400, "{message}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(2),
            "{field} took {:?}",
            started.elapsed()
        );
    }
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 8},
                "unit": {"enum": ["c", "f"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7}
            },
            "required": ["city", "unit", "days"],
            "additionalProperties": false
        }
    }})
}

#[tokio::test]
async fn required_tool_choice_yields_valid_tool_calls() {
    let tool = weather_tool();
    let body = chat(json!({
        "model": MODEL, "messages": messages(), "max_tokens": 200, "temperature": 1.0, "seed": 9,
        "tools": [tool], "tool_choice": "required", "parallel_tool_calls": false
    }))
    .await;
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
    let calls = choice["message"]["tool_calls"]
        .as_array()
        .expect("tool_calls");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["type"], "function");
    assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let arguments: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    validate(&arguments, &tool["function"]["parameters"], "$").unwrap();
}

/// Streams `request` and reassembles its tool calls from the deltas: the calls (name and
/// arguments), the finish reason and how many chunks carried tool-call deltas.
async fn streamed_tool_calls(request: &Value) -> (Vec<Value>, Option<String>, usize) {
    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let response = server()
        .post("/v1/chat/completions", ALICE, &streamed)
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), StatusCode::OK);
    let text = response.text().await.expect("body");
    let mut calls: Vec<Value> = Vec::new();
    let mut finish = None;
    let mut delta_chunks = 0;
    for data in text
        .split("\n\n")
        .filter_map(|block| block.strip_prefix("data: "))
    {
        if data == "[DONE]" {
            continue;
        }
        let event: Value = serde_json::from_str(data).expect("event");
        let choice = &event["choices"][0];
        delta_chunks += usize::from(choice["delta"]["tool_calls"].is_array());
        for delta in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let index = delta["index"].as_u64().unwrap() as usize;
            if calls.len() <= index {
                // A call's first delta names it; later ones carry only more arguments.
                assert!(
                    delta["id"].as_str().unwrap().starts_with("call_"),
                    "{delta}"
                );
                assert_eq!(delta["type"], "function", "{delta}");
                assert!(delta["function"]["name"].is_string(), "{delta}");
                calls.push(json!({"name": "", "arguments": ""}));
            } else {
                assert!(delta.get("id").is_none() && delta["function"].get("name").is_none());
            }
            if let Some(name) = delta["function"]["name"].as_str() {
                calls[index]["name"] = json!(name);
            }
            let arguments = calls[index]["arguments"].as_str().unwrap().to_owned()
                + delta["function"]["arguments"].as_str().unwrap_or_default();
            calls[index]["arguments"] = json!(arguments);
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            finish = Some(reason.to_owned());
        }
    }
    (calls, finish, delta_chunks)
}

/// The calls of a whole response as `{name, arguments}`.
fn whole_calls(whole: &Value) -> Vec<Value> {
    whole["choices"][0]["message"]["tool_calls"]
        .as_array()
        .map(|calls| {
            calls
                .iter()
                .map(|call| json!({"name": call["function"]["name"], "arguments": call["function"]["arguments"]}))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn streamed_tool_calls_reassemble_to_the_whole_response() {
    let request = json!({
        "model": MODEL, "messages": messages(), "max_tokens": 200, "temperature": 1.0, "seed": 4,
        "tools": [weather_tool()],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}
    });
    let whole = chat(request.clone()).await;
    let (calls, finish, delta_chunks) = streamed_tool_calls(&request).await;
    assert_eq!(finish.as_deref(), Some("tool_calls"));
    // The enforced call streams as it is generated: its name, then its arguments in pieces.
    assert!(delta_chunks > 3, "the call came in {delta_chunks} chunks");
    assert_eq!(calls, whole_calls(&whole));
}

/// An enforced call cut off by `max_tokens` keeps the arguments generated so far, with
/// `finish_reason: "length"`, in the whole response and the stream alike.
#[tokio::test]
async fn an_enforced_call_cut_off_by_max_tokens_keeps_its_partial_arguments() {
    let (mut found, mut complete) = (false, false);
    let mut partial: Vec<String> = Vec::new();
    for max_tokens in (6..120).step_by(3) {
        let request = json!({
            "model": MODEL, "messages": messages(), "max_tokens": max_tokens, "temperature": 1.0,
            "seed": 4, "tools": [weather_tool()],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}
        });
        let whole = chat(request.clone()).await;
        let choice = &whole["choices"][0];
        let calls = whole_calls(&whole);
        let (streamed, finish, _) = streamed_tool_calls(&request).await;
        if calls.is_empty() {
            // Cut before the name was complete: the text is the content.
            assert_eq!(choice["finish_reason"], "length", "{whole}");
            assert!(choice["message"]["content"].is_string(), "{whole}");
            assert!(streamed.is_empty());
            continue;
        }
        assert_eq!(streamed, calls, "max_tokens {max_tokens}");
        assert_eq!(finish.as_deref(), choice["finish_reason"].as_str());
        assert_eq!(calls[0]["name"], "get_weather");
        let arguments = calls[0]["arguments"].as_str().unwrap().to_owned();
        if choice["finish_reason"] == "length" {
            found |= serde_json::from_str::<Value>(&arguments).is_err();
            partial.push(arguments);
        } else {
            assert_eq!(choice["finish_reason"], "tool_calls");
            serde_json::from_str::<Value>(&arguments).expect("complete arguments");
            // The same seed generates the same prefix: each cut holds the start of the whole.
            for cut in &partial {
                assert!(arguments.starts_with(cut.as_str()), "{cut} vs {arguments}");
            }
            complete = true;
            break;
        }
    }
    assert!(complete, "the call never completed");
    assert!(found, "no max_tokens cut the call inside its arguments");
}

#[tokio::test]
async fn logit_bias_of_100_forces_the_token() {
    let response = server()
        .post(
            "/tokenize",
            ALICE,
            &json!({"model": MODEL, "prompt": " the", "add_special_tokens": false}),
        )
        .send()
        .await
        .expect("request");
    let tokens = json_of(response).await;
    let token = tokens["tokens"][0].as_u64().unwrap();
    let response = server()
        .post(
            "/v1/completions",
            ALICE,
            &json!({"model": MODEL, "prompt": "Hello", "max_tokens": 6, "temperature": 1.0,
                    "seed": 3, "logit_bias": {token.to_string(): 100}, "logprobs": 0}),
        )
        .send()
        .await
        .expect("request");
    let body = json_of(response).await;
    let choice = &body["choices"][0];
    let response = server()
        .post(
            "/detokenize",
            ALICE,
            &json!({"model": MODEL, "tokens": [token]}),
        )
        .send()
        .await
        .expect("request");
    let piece = json_of(response).await["prompt"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(choice["text"], piece.repeat(6), "{body}");
}

#[tokio::test]
async fn tokenize_detokenize_and_version() {
    let response = server()
        .post(
            "/tokenize",
            ALICE,
            &json!({"model": MODEL, "prompt": "Hello world"}),
        )
        .send()
        .await
        .expect("request");
    let body = json_of(response).await;
    let tokens: Vec<u64> = body["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert_eq!(body["count"], tokens.len());
    assert!(body["max_model_len"].as_u64().unwrap() > 0);
    let response = server()
        .post("/detokenize", ALICE, &json!({"tokens": tokens}))
        .send()
        .await
        .expect("request");
    let text = json_of(response).await["prompt"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(text.ends_with("Hello world"), "{text:?}");
    let chat = server()
        .post(
            "/tokenize",
            ALICE,
            &json!({"messages": [{"role": "user", "content": "hi"}]}),
        )
        .send()
        .await
        .expect("request");
    assert!(json_of(chat).await["count"].as_u64().unwrap() > 2);
    let response = server()
        .client()
        .get(server().url("/version"))
        .send()
        .await
        .expect("request");
    assert_eq!(
        json_of(response).await["version"],
        env!("CARGO_PKG_VERSION")
    );
    let response = server()
        .post("/detokenize", ALICE, &json!({"tokens": [1_000_000]}))
        .send()
        .await
        .expect("request");
    let error = expect_error(response, StatusCode::BAD_REQUEST).await;
    assert_eq!(error["param"], "tokens");
}
