//! gpt-oss's harmony format at the tokenizer: which tokenizers are o200k_harmony, and the
//! special tokens that frame its messages. A harmony model's output keeps those tokens as text
//! (the engine's detokenizer writes them) so that the server can read its channels
//! (`src/server/openai/harmony.rs`); every other special token is still dropped.

use tokenizers::Tokenizer;

/// The special tokens that frame harmony messages: the header's (`<|start|>`, `<|channel|>`,
/// `<|constrain|>`, `<|message|>`) and the ends (`<|end|>`, `<|call|>`, `<|return|>`).
pub const FRAMING_TOKENS: [&str; 7] = [
    "<|start|>",
    "<|channel|>",
    "<|constrain|>",
    "<|message|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
];

/// Whether `tokenizer` writes harmony messages: every framing token is one of its special
/// added tokens.
pub fn is_harmony(tokenizer: &Tokenizer) -> bool {
    let added = tokenizer.get_added_tokens_decoder();
    FRAMING_TOKENS.iter().all(|framing| {
        added
            .values()
            .any(|token| token.special && token.content == *framing)
    })
}
