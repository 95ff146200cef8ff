//! Reasoning output: the `<think>…</think>` block of reasoning models, returned apart from the
//! answer as `reasoning_content` (chat) or a reasoning item (Responses).
//!
//! Two families are known, detected from the chat template or set by `server.reasoning_parser`:
//! - Qwen3 (`qwen3`): the output may open with `<think>`; text before `</think>` is reasoning.
//!   Output without `</think>` is reasoning only while a `<think>` opened it (cut off by the
//!   length limit), else it is all answer (thinking disabled: the template closed the block).
//! - DeepSeek-R1 (`deepseek_r1`): the template opens the block (`<think>\n` after the
//!   assistant header), so the output is reasoning up to `</think>` (all of it when there is
//!   none), with an optional `<think>` of its own at the start.

/// The opening tag.
const OPEN: &str = "<think>";
/// The closing tag.
const CLOSE: &str = "</think>";

/// How a model family writes its reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasoningFormat {
    /// Qwen3: an optional `<think>…</think>` block opens the output.
    Qwen3,
    /// DeepSeek-R1: the output starts inside the block the template opened.
    DeepseekR1,
}

impl ReasoningFormat {
    /// The format a chat template's reasoning takes, recognised by its markers.
    pub fn detect(template_source: &str) -> Option<Self> {
        if !template_source.contains(CLOSE) {
            return None;
        }
        // DeepSeek-R1's template (and Qwen3's thinking-only ones) open the block in the
        // generation prompt.
        if template_source.contains("<｜Assistant｜><think>")
            || template_source.contains("assistant\\n<think>")
        {
            Some(Self::DeepseekR1)
        } else {
            Some(Self::Qwen3)
        }
    }

    /// The configuration name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Qwen3 => "qwen3",
            Self::DeepseekR1 => "deepseek_r1",
        }
    }

    /// Splits a whole output into its reasoning (`None` when there is none) and its answer.
    pub fn split(self, text: &str) -> (Option<String>, String) {
        let mut splitter = ReasoningSplitter::new(self);
        let (mut reasoning, mut content) = splitter.push(text);
        let (rest_reasoning, rest_content) = splitter.finish();
        reasoning.push_str(&rest_reasoning);
        content.push_str(&rest_content);
        if splitter.saw_reasoning {
            (Some(reasoning), content)
        } else {
            (None, content)
        }
    }
}

/// Where a streamed output is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing decisive seen yet (Qwen3: waiting for a possible `<think>`).
    Start,
    /// Inside the reasoning block.
    Reasoning,
    /// After it (or with no block): the answer.
    Answer,
}

/// Splits a streamed output into reasoning and answer text as tokens arrive. Text that may be
/// the start of a tag is held until the next piece decides it.
#[derive(Debug, Clone)]
pub struct ReasoningSplitter {
    format: ReasoningFormat,
    phase: Phase,
    /// Text not yet given out (a possible tag prefix).
    held: String,
    /// Whether any reasoning block was found.
    saw_reasoning: bool,
    /// Whether the answer's leading blank lines were skipped already.
    answer_started: bool,
}

impl ReasoningSplitter {
    /// A splitter at the start of an output in `format`.
    pub fn new(format: ReasoningFormat) -> Self {
        Self {
            format,
            phase: Phase::Start,
            held: String::new(),
            saw_reasoning: false,
            answer_started: false,
        }
    }

    /// Whether the output is in the answer (the reasoning, if any, has ended).
    pub fn in_answer(&self) -> bool {
        self.phase == Phase::Answer
    }

    /// Feeds the next piece of output; returns the reasoning and answer text it completes.
    pub fn push(&mut self, text: &str) -> (String, String) {
        self.held.push_str(text);
        let mut reasoning = String::new();
        let mut answer = String::new();
        loop {
            match self.phase {
                Phase::Start => {
                    let trimmed = self.held.trim_start();
                    if trimmed.starts_with(OPEN) {
                        let at = self.held.len() - trimmed.len() + OPEN.len();
                        self.held.drain(..at);
                        self.enter_reasoning();
                    } else if OPEN.starts_with(trimmed) {
                        // Empty or a prefix of `<think>`: wait for more.
                        return (reasoning, answer);
                    } else {
                        match self.format {
                            // No reasoning block: the output is the answer as written (its
                            // leading space included).
                            ReasoningFormat::Qwen3 => {
                                self.phase = Phase::Answer;
                                self.answer_started = true;
                            }
                            ReasoningFormat::DeepseekR1 => self.enter_reasoning(),
                        }
                    }
                }
                Phase::Reasoning => {
                    if let Some(at) = self.held.find(CLOSE) {
                        reasoning.push_str(&self.held[..at]);
                        self.held.drain(..at + CLOSE.len());
                        self.phase = Phase::Answer;
                    } else {
                        let keep = partial_tag_len(&self.held, CLOSE);
                        let out = self.held.len() - keep;
                        reasoning.push_str(&self.held[..out]);
                        self.held.drain(..out);
                        return (reasoning, answer);
                    }
                }
                Phase::Answer => {
                    if !self.answer_started {
                        // The blank lines after `</think>` belong to neither part.
                        let trimmed = self.held.trim_start();
                        if trimmed.is_empty() {
                            self.held.clear();
                            return (reasoning, answer);
                        }
                        let skip = self.held.len() - trimmed.len();
                        self.held.drain(..skip);
                        self.answer_started = true;
                    }
                    answer.push_str(&self.held);
                    self.held.clear();
                    return (reasoning, answer);
                }
            }
        }
    }

    fn enter_reasoning(&mut self) {
        self.phase = Phase::Reasoning;
        self.saw_reasoning = true;
    }

    /// The text still held at the end of the output.
    pub fn finish(&mut self) -> (String, String) {
        let held = std::mem::take(&mut self.held);
        match self.phase {
            Phase::Reasoning => (held, String::new()),
            Phase::Start if self.format == ReasoningFormat::DeepseekR1 && !held.is_empty() => {
                self.saw_reasoning = true;
                (held, String::new())
            }
            _ => (String::new(), held),
        }
    }
}

/// The length of the longest suffix of `text` that is a proper prefix of `tag`.
fn partial_tag_len(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&len| text.is_char_boundary(text.len() - len) && text.ends_with(&tag[..len]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen3_splits_a_think_block_and_keeps_plain_answers() {
        let format = ReasoningFormat::Qwen3;
        assert_eq!(
            format.split("<think>\nPlan it.\n</think>\n\nThe answer."),
            (Some("\nPlan it.\n".into()), "The answer.".into())
        );
        assert_eq!(format.split("Just text."), (None, "Just text.".into()));
        // Without a block nothing is trimmed: the answer keeps its leading space.
        assert_eq!(format.split(" Just text."), (None, " Just text.".into()));
        // Cut off while thinking: all reasoning.
        assert_eq!(
            format.split("<think>still going"),
            (Some("still going".into()), String::new())
        );
    }

    #[test]
    fn deepseek_r1_output_starts_inside_the_block() {
        let format = ReasoningFormat::DeepseekR1;
        assert_eq!(
            format.split("Hmm.</think>\n\nYes."),
            (Some("Hmm.".into()), "Yes.".into())
        );
        assert_eq!(
            format.split("<think>Hmm.</think>Yes."),
            (Some("Hmm.".into()), "Yes.".into())
        );
        assert_eq!(
            format.split("no end"),
            (Some("no end".into()), String::new())
        );
    }

    #[test]
    fn streamed_pieces_give_the_whole_split_wherever_they_break() {
        let text = "<think>a < b </thi</think>\n\n<tool_call>{}</tool_call>";
        for format in [ReasoningFormat::Qwen3, ReasoningFormat::DeepseekR1] {
            let whole = format.split(text);
            for size in 1..=text.len() {
                let mut splitter = ReasoningSplitter::new(format);
                let (mut reasoning, mut answer) = (String::new(), String::new());
                let chars: Vec<char> = text.chars().collect();
                for piece in chars.chunks(size) {
                    let (r, a) = splitter.push(&piece.iter().collect::<String>());
                    reasoning.push_str(&r);
                    answer.push_str(&a);
                }
                let (r, a) = splitter.finish();
                reasoning.push_str(&r);
                answer.push_str(&a);
                assert_eq!(Some(reasoning), whole.0, "size {size}");
                assert_eq!(answer, whole.1, "size {size}");
            }
            assert_eq!(whole.1, "<tool_call>{}</tool_call>");
        }
    }

    #[test]
    fn templates_are_recognised() {
        assert_eq!(
            ReasoningFormat::detect("{%- if enable_thinking %}<think>\n\n</think>{% endif %}"),
            Some(ReasoningFormat::Qwen3)
        );
        assert_eq!(
            ReasoningFormat::detect("{{'<｜Assistant｜><think>\\n'}}...</think>"),
            Some(ReasoningFormat::DeepseekR1)
        );
        assert_eq!(
            ReasoningFormat::detect("{{- '<|im_start|>assistant\\n<think>\\n' }}</think>"),
            Some(ReasoningFormat::DeepseekR1)
        );
        assert_eq!(ReasoningFormat::detect("{{ messages }}"), None);
    }
}
