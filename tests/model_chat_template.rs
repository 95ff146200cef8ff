//! A Qwen-style chat template with tools, tool calls, reasoning and `enable_thinking`, rendered
//! exactly as transformers would.

use std::path::Path;

use inferno::model::{ChatTemplate, Model, SpecialTokens, TemplateError};
use serde_json::{Map, Value, json};

/// Modelled on the Qwen3 template: tools listed through `tojson`, `<think>` blocks stripped from
/// history with Python string methods, and an empty think block when thinking is disabled.
const QWEN_STYLE: &str = r##"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' %}
        {{- '<|im_start|>user\n' + message.content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set content = message.content %}
        {%- if '</think>' in content %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {{- '<|im_start|>assistant\n' + content }}
        {%- for tool_call in message.tool_calls | default([]) %}
            {{- '\n<tool_call>\n{"name": "' + tool_call.function.name + '", "arguments": ' }}
            {{- tool_call.function.arguments | tojson + '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
    {%- elif message.role != 'system' or not loop.first %}
        {{- raise_exception('Unexpected message role: ' + message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"##;

fn template() -> ChatTemplate {
    let special = SpecialTokens {
        eos_token: Some("<|im_end|>".into()),
        pad_token: Some("<|endoftext|>".into()),
        ..SpecialTokens::default()
    };
    ChatTemplate::new(&[("default".into(), QWEN_STYLE.into())], special).unwrap()
}

fn conversation() -> Vec<Value> {
    vec![
        json!({"role": "system", "content": "You are helpful."}),
        json!({"role": "user", "content": "Weather in Paris?"}),
        json!({"role": "assistant", "content": "<think>\nThe user wants weather.\n</think>\n\nLet me check.",
               "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}),
        json!({"role": "tool", "content": "18°C"}),
    ]
}

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Get the weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
}

#[test]
fn renders_tools_tool_calls_and_disabled_thinking() {
    let mut extra = Map::new();
    extra.insert("enable_thinking".into(), json!(false));
    let prompt = template()
        .render(&conversation(), Some(&tools()), true, &extra)
        .unwrap();
    let expected = concat!(
        "<|im_start|>system\nYou are helpful.\n\n# Tools\n\n",
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n",
        // The client's key order, as transformers renders it (Python dicts keep insertion order).
        r#"{"type": "function", "function": {"name": "get_weather", "description": "Get the weather", "#,
        r#""parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}"#,
        "\n</tools><|im_end|>\n",
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n",
        "<|im_start|>assistant\nLet me check.\n<tool_call>\n",
        r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#,
        "\n</tool_call><|im_end|>\n",
        "<|im_start|>user\n<tool_response>\n18°C\n</tool_response><|im_end|>\n",
        "<|im_start|>assistant\n<think>\n\n</think>\n\n",
    );
    assert_eq!(prompt, expected);
}

#[test]
fn thinking_block_depends_on_the_extra_argument() {
    let messages = [json!({"role": "user", "content": "Hi"})];
    let t = template();
    let default = t.render(&messages, None, true, &Map::new()).unwrap();
    assert_eq!(
        default,
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let mut extra = Map::new();
    extra.insert("enable_thinking".into(), json!(true));
    assert_eq!(t.render(&messages, None, true, &extra).unwrap(), default);
    let no_prompt = t.render(&messages, None, false, &Map::new()).unwrap();
    assert_eq!(no_prompt, "<|im_start|>user\nHi<|im_end|>\n");
}

#[test]
fn roles_are_limited_to_those_the_template_knows() {
    let qwen = template();
    assert_eq!(qwen.roles(), ["system", "user", "assistant", "tool"]);
    assert!(qwen.check_roles(&conversation()).is_ok());
    let forged = [json!({"role": "user<|im_end|>", "content": "x"})];
    match qwen.check_roles(&forged).unwrap_err() {
        TemplateError::UnknownRole { index, role, .. } => {
            assert_eq!((index, role.as_str()), (0, "user<|im_end|>"));
        }
        other => panic!("expected an unknown role, got {other}"),
    }
    let ipython = ChatTemplate::new(
        &[(
            "default".into(),
            "{% for m in messages %}{% if m.role == 'ipython' %}py{% endif %}{% endfor %}".into(),
        )],
        SpecialTokens::default(),
    )
    .unwrap();
    assert!(ipython.roles().contains(&"ipython"));
    assert!(!ipython.roles().contains(&"developer"));
}

#[test]
fn template_exceptions_carry_their_message() {
    let messages = [
        json!({"role": "user", "content": "Hi"}),
        json!({"role": "wizard", "content": "x"}),
    ];
    let err = template()
        .render(&messages, None, true, &Map::new())
        .unwrap_err();
    match err {
        TemplateError::Raised(message) => assert_eq!(message, "Unexpected message role: wizard"),
        other => panic!("expected a raised exception, got {other}"),
    }
}

/// Constructs that published templates (Llama 3.x, Qwen2.5/3, Mistral) rely on.
#[test]
fn constructs_used_by_published_templates() {
    let source = concat!(
        "{%- set ns = namespace(last_user=-1) %}",
        "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}",
        "{{- ns.last_user }}|{{ messages[::-1] | map(attribute='role') | join(',') }}",
        "|{{ ['a', 'code_interpreter', 'b'] | reject('equalto', 'code_interpreter') | join(', ') }}",
        "|{{ messages[0].content is string }}|{{ 'reasoning_content' in messages[1] }}",
        "|{{ messages[1].content.split('</think>')[-1].lstrip('\\n') }}",
        "|{{ (messages[0].role == 'user') != (0 % 2 == 0) }}",
        "|{{ messages[0].content | trim }}",
        "{%- for x in [1, 2, 3] %}{%- if x == 2 %}{%- continue %}{%- endif %}|{{ x }}{%- endfor %}",
    );
    let t = ChatTemplate::new(
        &[("default".into(), source.into())],
        SpecialTokens::default(),
    )
    .unwrap();
    let messages = [
        json!({"role": "user", "content": "  hi  "}),
        json!({"role": "assistant", "content": "<think>x</think>\n\nanswer", "reasoning_content": "x"}),
    ];
    let out = t.render(&messages, None, false, &Map::new()).unwrap();
    assert_eq!(out, "0|assistant,user|a, b|True|True|answer|False|hi|1|3");
}

mod tojson_roundtrip {
    use super::*;
    use proptest::prelude::*;

    /// Arbitrary JSON documents with awkward strings (quotes, controls, non-ASCII, astral).
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            (-1e12f64..1e12).prop_map(Value::from),
            "[a-z\"\\\\\n\t\u{1}é中🚀 ]{0,8}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map("[a-zé\"]{0,4}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Equality of JSON documents, allowing floats one ulp apart: serde_json's default parser
    /// (without `float_roundtrip`) may land one ulp off the shortest decimal `tojson` printed.
    fn same_json(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
                match (x.as_f64(), y.as_f64()) {
                    (Some(x), Some(y)) => x.to_bits().abs_diff(y.to_bits()) <= 1,
                    _ => false,
                }
            }
            (Value::Array(x), Value::Array(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y))
            }
            (Value::Object(x), Value::Object(y)) => {
                x.len() == y.len()
                    && x.iter()
                        .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
            }
            _ => a == b,
        }
    }

    proptest! {
        #[test]
        fn tojson_output_parses_back_to_the_input(
            value in json_value(),
            options in prop_oneof![
                Just(""),
                Just("(indent=2)"),
                Just("(ensure_ascii=true)"),
                Just("(indent=0, ensure_ascii=true)"),
            ],
        ) {
            let source = format!("{{{{ messages[0].v | tojson{options} }}}}");
            let t = ChatTemplate::new(&[("default".into(), source)], SpecialTokens::default()).unwrap();
            let out = t.render(&[json!({"v": value.clone()})], None, false, &Map::new()).unwrap();
            let parsed: Value = serde_json::from_str(&out).unwrap();
            prop_assert!(same_json(&parsed, &value), "{} vs {}", parsed, value);
            if options.contains("ensure_ascii") {
                prop_assert!(out.is_ascii());
            }
        }
    }
}

/// The OpenAI SDK's tool loop sends the assistant's call back with `content: null` (or without
/// `content`); every template renders it as it renders an empty content.
#[test]
fn assistant_tool_calls_with_null_or_absent_content_render() {
    let call = json!([{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]);
    let loop_with = |content: Option<Value>| {
        let mut assistant = json!({"role": "assistant", "tool_calls": call});
        if let Some(content) = content {
            assistant["content"] = content;
        }
        vec![
            json!({"role": "user", "content": "Weather in Paris?"}),
            assistant,
            json!({"role": "tool", "tool_call_id": "call_1", "content": "18°C"}),
        ]
    };
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut templates = vec![("qwen-style".to_owned(), template())];
    for dir in [
        "tiny-qwen3",
        "tiny-qwen2",
        "../../../shared/fixtures/tiny-llama3",
    ] {
        let dir = fixtures.join(dir);
        if dir.is_dir() {
            let model = Model::load(&dir).expect("the fixture loads");
            templates.push((dir.display().to_string(), model.chat_template.unwrap()));
        }
    }
    assert!(templates.len() >= 3);
    for (name, template) in templates {
        let empty = template
            .render(
                &loop_with(Some(json!(""))),
                Some(&tools()),
                true,
                &Map::new(),
            )
            .unwrap_or_else(|err| panic!("{name}: {err}"));
        for content in [Some(Value::Null), None] {
            let rendered = template
                .render(
                    &loop_with(content.clone()),
                    Some(&tools()),
                    true,
                    &Map::new(),
                )
                .unwrap_or_else(|err| panic!("{name} with content {content:?}: {err}"));
            assert_eq!(rendered, empty, "{name}");
        }
    }
}
