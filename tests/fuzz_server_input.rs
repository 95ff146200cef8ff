//! Bounded fuzzing of what a client controls before generation: the OpenAI request parser and
//! the chat-template rendering. Every input must give a value or a clear error, never a panic,
//! and parser errors are HTTP 400 with a message.
//!
//! In the test suite each property runs proptest's default number of cases; `scripts/fuzz.sh`
//! runs them with many more for a bounded time. A failing input is shrunk and kept by proptest
//! in `tests/fuzz_server_input.proptest-regressions`, which is committed: every later run
//! replays it first, so a crash found once stays a regression test.

use inferno::config::LimitsConfig;
use inferno::engine::SamplingParams;
use inferno::model::{ChatTemplate, SpecialTokens};
use inferno::server::openai::request::{parse_chat, parse_completion};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// JSON values with awkward leaves: huge and negative numbers, special-token text, control
/// characters, non-ASCII.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::from)),
        "[a-z<|>_\"\\\\\n\u{0}é🚀 ]{0,12}".prop_map(Value::from),
        Just(Value::from("<|eot_id|>")),
    ];
    leaf.prop_recursive(3, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
            prop::collection::btree_map("[a-z_]{0,8}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Request-shaped objects: the fields the parser reads, each with an arbitrary value, plus a
/// well-formed core so that deeper checks are reached too.
fn request_object() -> impl Strategy<Value = Value> {
    let field = prop_oneof![
        Just("model"),
        Just("messages"),
        Just("prompt"),
        Just("max_tokens"),
        Just("max_completion_tokens"),
        Just("temperature"),
        Just("top_p"),
        Just("top_k"),
        Just("n"),
        Just("stop"),
        Just("stream"),
        Just("stream_options"),
        Just("logprobs"),
        Just("top_logprobs"),
        Just("seed"),
        Just("tools"),
        Just("chat_template_kwargs"),
        Just("echo"),
        Just("suffix"),
    ];
    prop::collection::vec((field, json_value()), 0..6).prop_map(|fields| {
        let mut object = json!({
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "prompt": "hi",
        });
        for (name, value) in fields {
            object[name] = value;
        }
        object
    })
}

fn check_parse(body: &[u8]) -> Result<(), TestCaseError> {
    let limits = LimitsConfig::default();
    let defaults = SamplingParams::default();
    for result in [
        parse_chat(body, &defaults, &limits).map(drop),
        parse_completion(body, &defaults, &limits).map(drop),
    ] {
        if let Err(err) = result {
            prop_assert_eq!(err.status.as_u16(), 400, "{}", err.message);
            prop_assert!(!err.message.is_empty());
            let json: Value = serde_json::from_str(&err.to_json()).expect("error JSON");
            prop_assert!(json["error"]["message"].is_string());
        }
    }
    Ok(())
}

/// The Llama 3 template of the test model.
const LLAMA3: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

/// A template that walks tools, tool calls and arguments the way published ones do.
const TOOLS: &str = "{%- if tools %}{{- tools | tojson }}{%- endif %}{%- for m in messages %}{%- if m.role not in ['system', 'user', 'assistant', 'tool'] %}{{- raise_exception('bad role ' + m.role|string) }}{%- endif %}<{{ m.role }}>{{ m.content if m.content is string else m.content | tojson }}{%- for c in m.tool_calls | default([]) %}[{{ c.function.name }}:{{ c.function.arguments | tojson }}]{%- endfor %}{%- endfor %}{%- if add_generation_prompt %}<assistant>{%- endif %}";

fn templates() -> Vec<ChatTemplate> {
    let special = SpecialTokens {
        bos_token: Some("<|begin_of_text|>".into()),
        eos_token: Some("<|eot_id|>".into()),
        ..SpecialTokens::default()
    };
    [LLAMA3, TOOLS]
        .into_iter()
        .map(|source| {
            ChatTemplate::new(&[("default".into(), source.into())], special.clone())
                .expect("template compiles")
        })
        .collect()
}

fn message() -> impl Strategy<Value = Value> {
    let role = prop_oneof![
        Just(Value::from("user")),
        Just(Value::from("assistant")),
        Just(Value::from("system")),
        Just(Value::from("tool")),
        json_value(),
    ];
    (role, json_value(), proptest::option::of(json_value())).prop_map(|(role, content, calls)| {
        let mut message = json!({"role": role, "content": content});
        if let Some(calls) = calls {
            message["tool_calls"] = calls;
        }
        message
    })
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_crash_the_parser(body in prop::collection::vec(any::<u8>(), 0..256)) {
        check_parse(&body)?;
    }

    #[test]
    fn arbitrary_json_never_crashes_the_parser(value in json_value()) {
        check_parse(value.to_string().as_bytes())?;
    }

    #[test]
    fn request_shaped_json_never_crashes_the_parser(value in request_object()) {
        check_parse(value.to_string().as_bytes())?;
    }

    #[test]
    fn chat_templates_render_or_refuse_any_conversation(
        messages in prop::collection::vec(message(), 0..5),
        tools in proptest::option::of(json_value()),
        add_generation_prompt in any::<bool>(),
        extra in prop::collection::btree_map("[a-z_]{1,8}", json_value(), 0..3),
    ) {
        let extra: Map<String, Value> = extra.into_iter().collect();
        for template in templates() {
            // An error is a refusal (HTTP 400); a panic would take the request's thread down.
            let _ = template.check_roles(&messages);
            let _ = template.render(&messages, tools.as_ref(), add_generation_prompt, &extra);
        }
    }
}
