//! The harmony output format of gpt-oss: the assistant's output is a sequence of messages, each a
//! header (`<|start|>assistant`, omitted for the first, which the prompt opened; then
//! `<|channel|>NAME`, an optional recipient ` to=functions.NAME` before or after the channel, and
//! an optional ` <|constrain|>json`), `<|message|>`, the body, and `<|end|>`, `<|call|>` or
//! `<|return|>`. The `analysis` channel is reasoning (`reasoning_content`), `final` the answer
//! (`content`), and a message addressed to `functions.NAME` a tool call whose body is its JSON
//! arguments; a `commentary` message without a recipient (a preamble) is answer text too.
//!
//! [`HarmonyParser`] reads the output as its text (special tokens included) arrives and returns
//! OpenAI deltas; [`parse`] reads a whole output the same way. A truncated or malformed sequence
//! ends with what was parsed and one logged warning: it is never an error.

use serde_json::{Value, json};

use super::tools::{ParsedToolCall, ToolCallUpdate};

/// Opens a message header after the first.
const START: &str = "<|start|>";
/// Names the channel.
const CHANNEL: &str = "<|channel|>";
/// Ends the header.
const MESSAGE: &str = "<|message|>";
/// The tokens that end a message.
const ENDS: [&str; 3] = ["<|end|>", "<|call|>", "<|return|>"];
/// The prefix every special token starts with.
const SPECIAL: &str = "<|";

/// What a message's body is.
#[derive(Debug, Clone, PartialEq)]
enum Body {
    /// `analysis`: reasoning.
    Reasoning,
    /// `final`, or `commentary` without a recipient: the answer.
    Content,
    /// A call of the function: the index of the call.
    ToolCall(usize),
    /// Another recipient or channel: not shown.
    Ignored,
}

/// Where the parser is.
#[derive(Debug, Clone, PartialEq)]
enum State {
    /// Reading a header, up to `<|message|>`.
    Header,
    /// Reading a body, up to an end token.
    Body(Body),
}

/// One piece of an output, as OpenAI streams it.
#[derive(Debug, Clone, PartialEq)]
pub enum HarmonyDelta {
    /// More reasoning (`delta.reasoning_content`).
    Reasoning(String),
    /// More answer (`delta.content`).
    Content(String),
    /// A tool call's start or more of its arguments (`delta.tool_calls`).
    ToolCall(ToolCallUpdate),
}

/// A whole output, parsed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HarmonyMessage {
    /// The `analysis` channel's text, `None` when there was none.
    pub reasoning: Option<String>,
    /// The answer's text.
    pub content: String,
    /// The tool calls, in order.
    pub tool_calls: Vec<ParsedToolCall>,
    /// Whether the sequence was truncated or malformed (what was parsed is kept).
    pub malformed: bool,
}

/// Reads a harmony output incrementally.
#[derive(Debug, Clone)]
pub struct HarmonyParser {
    state: State,
    /// Text not yet decided: a header being read, or a possible special token's prefix.
    held: String,
    /// Tool calls started so far.
    calls: usize,
    /// Whether the sequence was malformed (and the warning logged).
    malformed: bool,
}

impl Default for HarmonyParser {
    fn default() -> Self {
        Self::new()
    }
}

impl HarmonyParser {
    /// A parser at the start of an output, inside the first message's header.
    pub fn new() -> Self {
        Self {
            state: State::Header,
            held: String::new(),
            calls: 0,
            malformed: false,
        }
    }

    /// Feeds the next piece of output; returns the deltas it completes.
    pub fn push(&mut self, text: &str) -> Vec<HarmonyDelta> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            match &self.state {
                State::Header => {
                    let Some(at) = self.held.find(MESSAGE) else {
                        return out;
                    };
                    let header: String = self.held.drain(..at + MESSAGE.len()).collect();
                    let body = self.header(&header[..at], &mut out);
                    self.state = State::Body(body);
                }
                State::Body(body) => {
                    let body = body.clone();
                    let special = self.held.find(SPECIAL);
                    let end = special.and_then(|at| {
                        let rest = &self.held[at..];
                        ENDS.iter()
                            .find(|e| rest.starts_with(**e))
                            .map(|e| (at, e.len()))
                    });
                    match (special, end) {
                        (_, Some((at, len))) => {
                            let text: String = self.held.drain(..at).collect();
                            self.held.drain(..len);
                            emit(&body, text, &mut out);
                            self.state = State::Header;
                        }
                        (Some(at), None) => {
                            let rest = &self.held[at..];
                            if is_prefix_of_special(rest) {
                                // Wait for the next piece to decide.
                                let text: String = self.held.drain(..at).collect();
                                emit(&body, text, &mut out);
                                return out;
                            }
                            if [START, CHANNEL, MESSAGE]
                                .iter()
                                .any(|t| rest.starts_with(t))
                            {
                                // A new header without the end of this message.
                                self.warn("a message without its end token");
                                let text: String = self.held.drain(..at).collect();
                                emit(&body, text, &mut out);
                                self.state = State::Header;
                            } else {
                                // Another special token, or `<|` as text: part of the body.
                                let text: String = self.held.drain(..at + SPECIAL.len()).collect();
                                emit(&body, text, &mut out);
                            }
                        }
                        (None, None) => {
                            // A trailing `<` may start a special token.
                            let keep = usize::from(self.held.ends_with('<'));
                            let text: String = self.held.drain(..self.held.len() - keep).collect();
                            emit(&body, text, &mut out);
                            return out;
                        }
                    }
                }
            }
        }
    }

    /// Ends the output: what is held is given out, and a message cut off (a header without its
    /// body, or a body without its end token) is logged as truncated. `stopped`: the output
    /// ended at a stop token (`<|return|>`, `<|call|>`: the engine ends there without writing
    /// it), which ends the message being written.
    pub fn finish(&mut self, stopped: bool) -> Vec<HarmonyDelta> {
        let mut out = Vec::new();
        let held = std::mem::take(&mut self.held);
        match &self.state {
            State::Header if held.trim().is_empty() => {}
            State::Header => self.warn("a message header without its body"),
            State::Body(body) => {
                let body = body.clone();
                emit(&body, held, &mut out);
                if !stopped {
                    self.warn("a message without its end token");
                }
            }
        }
        self.state = State::Header;
        out
    }

    /// Whether the sequence was truncated or malformed so far.
    pub fn malformed(&self) -> bool {
        self.malformed
    }

    /// Reads a header; a tool call's start goes into `out`.
    fn header(&mut self, header: &str, out: &mut Vec<HarmonyDelta>) -> Body {
        // A word runs to the next space or special token.
        let word_after = |marker: &str| {
            header.find(marker).map(|at| {
                let rest = &header[at + marker.len()..];
                let end = rest
                    .find(|c: char| c.is_whitespace() || c == '<')
                    .unwrap_or(rest.len());
                rest[..end].to_owned()
            })
        };
        let channel = word_after(CHANNEL);
        let recipient = word_after("to=");
        if let Some(name) = recipient
            .as_deref()
            .and_then(|r| r.strip_prefix("functions."))
        {
            let index = self.calls;
            self.calls += 1;
            out.push(HarmonyDelta::ToolCall(ToolCallUpdate::Start {
                index,
                name: name.to_owned(),
            }));
            return Body::ToolCall(index);
        }
        match (channel.as_deref(), recipient) {
            (Some("analysis"), None) => Body::Reasoning,
            (Some("final") | Some("commentary"), None) => Body::Content,
            (None, None) => {
                self.warn("a message header without a channel");
                Body::Content
            }
            _ => Body::Ignored,
        }
    }

    /// Marks the sequence malformed, logging the first problem only.
    fn warn(&mut self, what: &str) {
        if !self.malformed {
            tracing::warn!(
                problem = what,
                "malformed harmony output: ending with what was parsed"
            );
        }
        self.malformed = true;
    }
}

/// Whether `rest` (which starts with `<|`) may still become a special token that decides the
/// body: an end token or a header token.
fn is_prefix_of_special(rest: &str) -> bool {
    ENDS.iter()
        .chain(&[START, CHANNEL, MESSAGE])
        .any(|t| t.len() > rest.len() && t.starts_with(rest))
}

/// Adds `text` of a body of kind `body` to `out` (nothing when empty or not shown).
fn emit(body: &Body, text: String, out: &mut Vec<HarmonyDelta>) {
    if text.is_empty() {
        return;
    }
    let delta = match body {
        Body::Reasoning => HarmonyDelta::Reasoning(text),
        Body::Content => HarmonyDelta::Content(text),
        Body::ToolCall(index) => HarmonyDelta::ToolCall(ToolCallUpdate::Arguments {
            index: *index,
            fragment: text,
        }),
        Body::Ignored => return,
    };
    out.push(delta);
}

/// Parses a whole output; `stopped` as for [`HarmonyParser::finish`].
pub fn parse(text: &str, stopped: bool) -> HarmonyMessage {
    let mut parser = HarmonyParser::new();
    let mut deltas = parser.push(text);
    deltas.extend(parser.finish(stopped));
    collect(deltas, parser.malformed())
}

/// The grammar (llguidance's Lark) of a harmony output that must call one of `tools` (OpenAI
/// chat tools, `{"type": "function", "function": {...}}`): an optional `analysis` message, then
/// a `commentary` message to `functions.NAME` with `<|constrain|>json` whose body is arguments
/// that follow the function's parameter schema, written compact as gpt-oss writes them (no
/// whitespace outside strings, unless the schema sets its own `x-guidance`). The framing tokens are the tokenizer's special
/// tokens (`<|channel|>`, not its text); the model then ends at a stop token (`<|call|>`).
pub fn call_grammar(tools: &[&Value]) -> String {
    let mut grammar = String::from(
        "start: analysis? call\n\
         analysis: <|channel|> \"analysis\" <|message|> REASONING <|end|> <|start|> \"assistant\"\n\
         REASONING: /(.|\\n)*/\n",
    );
    let names: Vec<String> = (0..tools.len()).map(|i| format!("call_{i}")).collect();
    grammar.push_str(&format!("call: {}\n", names.join(" | ")));
    for (name, tool) in names.iter().zip(tools) {
        let function = &tool["function"];
        let mut parameters = match &function["parameters"] {
            Value::Object(schema) if !schema.is_empty() => schema.clone(),
            _ => serde_json::Map::from_iter([("type".to_owned(), json!("object"))]),
        };
        // gpt-oss writes its arguments without spaces (`{"location":"Tokyo"}`).
        parameters.entry("x-guidance").or_insert_with(
            || json!({"whitespace_flexible": false, "item_separator": ",", "key_separator": ":"}),
        );
        let header = format!(
            "commentary to=functions.{} ",
            function["name"].as_str().unwrap_or_default()
        );
        grammar.push_str(&format!(
            "{name}: <|channel|> {} <|constrain|> \"json\" <|message|> %json {}\n",
            Value::String(header),
            Value::Object(parameters)
        ));
    }
    grammar
}

/// Gathers deltas into a message.
pub fn collect(deltas: Vec<HarmonyDelta>, malformed: bool) -> HarmonyMessage {
    let mut message = HarmonyMessage {
        malformed,
        ..HarmonyMessage::default()
    };
    for delta in deltas {
        match delta {
            HarmonyDelta::Reasoning(text) => {
                message
                    .reasoning
                    .get_or_insert_with(String::new)
                    .push_str(&text);
            }
            HarmonyDelta::Content(text) => message.content.push_str(&text),
            HarmonyDelta::ToolCall(ToolCallUpdate::Start { name, .. }) => {
                message.tool_calls.push(ParsedToolCall {
                    name,
                    arguments: String::new(),
                });
            }
            HarmonyDelta::ToolCall(ToolCallUpdate::Arguments { index, fragment }) => {
                if let Some(call) = message.tool_calls.get_mut(index) {
                    call.arguments.push_str(&fragment);
                }
            }
        }
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recorded outputs (as the detokenizer writes them with special tokens kept).
    const REASONING_THEN_FINAL: &str = "<|channel|>analysis<|message|>User asks 2+2. Simple.<|end|>\
        <|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>";
    const TOOL_CALL: &str = "<|channel|>commentary to=functions.get_weather <|constrain|>json\
        <|message|>{\"location\": \"Paris\"}<|call|>";
    const REASONING_AND_TOOL_CALL: &str = "<|channel|>analysis<|message|>Need the weather; call \
        the tool.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json\
        <|message|>{\"location\": \"Tokyo\", \"unit\": \"c\"}<|call|>";
    const TWO_TOOL_CALLS: &str = "<|channel|>analysis<|message|>Two lookups.<|end|>\
        <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json\
        <|message|>{\"location\": \"Oslo\"}<|call|>\
        <|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json\
        <|message|>{\"zone\": \"CET\"}<|call|>";
    const TRUNCATED: &str = "<|channel|>analysis<|message|>Thinking about <|im|> tokens<|end|><|start|>assistant\
        <|channel|>final<|message|>The answer is cut";

    fn call(name: &str, arguments: &str) -> ParsedToolCall {
        ParsedToolCall {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    /// Each recorded output, whole, and its expected message.
    fn cases() -> Vec<(&'static str, HarmonyMessage)> {
        vec![
            (
                REASONING_THEN_FINAL,
                HarmonyMessage {
                    reasoning: Some("User asks 2+2. Simple.".into()),
                    content: "2 + 2 = 4.".into(),
                    tool_calls: vec![],
                    malformed: false,
                },
            ),
            (
                TOOL_CALL,
                HarmonyMessage {
                    reasoning: None,
                    content: String::new(),
                    tool_calls: vec![call("get_weather", "{\"location\": \"Paris\"}")],
                    malformed: false,
                },
            ),
            (
                REASONING_AND_TOOL_CALL,
                HarmonyMessage {
                    reasoning: Some("Need the weather; call the tool.".into()),
                    content: String::new(),
                    tool_calls: vec![call(
                        "get_weather",
                        "{\"location\": \"Tokyo\", \"unit\": \"c\"}",
                    )],
                    malformed: false,
                },
            ),
            (
                TWO_TOOL_CALLS,
                HarmonyMessage {
                    reasoning: Some("Two lookups.".into()),
                    content: String::new(),
                    tool_calls: vec![
                        call("get_weather", "{\"location\": \"Oslo\"}"),
                        call("get_time", "{\"zone\": \"CET\"}"),
                    ],
                    malformed: false,
                },
            ),
            (
                TRUNCATED,
                HarmonyMessage {
                    reasoning: Some("Thinking about <|im|> tokens".into()),
                    content: "The answer is cut".into(),
                    tool_calls: vec![],
                    malformed: true,
                },
            ),
        ]
    }

    #[test]
    fn whole_outputs_are_parsed() {
        for (text, want) in cases() {
            assert_eq!(parse(text, false), want, "{text}");
        }
    }

    /// Streamed in pieces of every size from 1 to 9 bytes (splitting every special token), the
    /// deltas add up to the whole parse; a call's start comes before its arguments, and the
    /// arguments arrive in several deltas.
    #[test]
    fn streamed_outputs_add_up_to_the_whole() {
        for (text, want) in cases() {
            for size in 1..=9 {
                let mut parser = HarmonyParser::new();
                let mut deltas = Vec::new();
                let bytes = text.as_bytes();
                for piece in bytes.chunks(size) {
                    deltas.extend(parser.push(std::str::from_utf8(piece).unwrap()));
                }
                deltas.extend(parser.finish(false));
                let argument_deltas = deltas
                    .iter()
                    .filter(|d| {
                        matches!(d, HarmonyDelta::ToolCall(ToolCallUpdate::Arguments { .. }))
                    })
                    .count();
                if !want.tool_calls.is_empty() && size < 4 {
                    assert!(argument_deltas > want.tool_calls.len(), "{text} / {size}");
                }
                assert!(!deltas.iter().any(|d| match d {
                    HarmonyDelta::Reasoning(t) | HarmonyDelta::Content(t) =>
                        t.contains("<|e") || t.contains("<|s") || t.contains("<|c"),
                    HarmonyDelta::ToolCall(_) => false,
                }));
                assert_eq!(collect(deltas, parser.malformed()), want, "{text} / {size}");
            }
        }
    }

    /// A body interrupted by a new header, and a header cut off: what was parsed is kept and
    /// the output is marked malformed.
    #[test]
    fn malformed_sequences_end_with_what_was_parsed() {
        let m = parse(
            "<|channel|>analysis<|message|>half a thought<|start|>assistant<|channel|>final\
             <|message|>Answer.<|return|>",
            false,
        );
        assert_eq!(m.reasoning.as_deref(), Some("half a thought"));
        assert_eq!(m.content, "Answer.");
        assert!(m.malformed);
        let m = parse(
            "<|channel|>final<|message|>Done.<|end|><|start|>assistant<|chan",
            true,
        );
        assert_eq!(m.content, "Done.");
        assert!(m.malformed);
        assert_eq!(parse("", true), HarmonyMessage::default());
        // The stop token that ends a message is not written: a body that runs to the end of an
        // output the stop token ended is whole.
        let m = parse("<|channel|>final<|message|>Done.", true);
        assert_eq!((m.content.as_str(), m.malformed), ("Done.", false));
        assert!(parse("<|channel|>final<|message|>Done.", false).malformed);
    }
}
