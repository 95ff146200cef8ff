//! Incremental detokenization that never splits a UTF-8 character.
//!
//! Byte-level tokenizers can spread one character over several tokens, and decoding can depend on
//! the tokens before (spaces, merges). The decoder keeps a small window of recent tokens, decodes
//! the window with and without the newest tokens, and releases only the difference, and only once
//! it no longer ends in an incomplete character (which decoding renders as U+FFFD).

use tokenizers::Tokenizer;

/// Tokens held back at most while waiting for a character to complete; beyond this the bytes are
/// released as they decode (invalid UTF-8 from the model must not stall the stream).
const MAX_PENDING_TOKENS: usize = 8;

/// Turns a stream of token ids into a stream of complete UTF-8 text.
#[derive(Debug, Default, Clone)]
pub struct IncrementalDecoder {
    ids: Vec<u32>,
    /// Start of the context window.
    prefix_offset: usize,
    /// End of the text already released.
    read_offset: usize,
}

impl IncrementalDecoder {
    /// A decoder with no tokens.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a token and returns the text it completes (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, token: u32) -> Result<String, tokenizers::Error> {
        self.ids.push(token);
        let pending = self.ids.len() - self.read_offset;
        self.release(tokenizer, pending > MAX_PENDING_TOKENS)
    }

    /// Releases whatever text is still held, complete or not (at the end of a generation).
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<String, tokenizers::Error> {
        self.release(tokenizer, true)
    }

    fn release(&mut self, tokenizer: &Tokenizer, force: bool) -> Result<String, tokenizers::Error> {
        if self.read_offset == self.ids.len() {
            return Ok(String::new());
        }
        let released = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset], true)?;
        let window = tokenizer.decode(&self.ids[self.prefix_offset..], true)?;
        let complete = !window.ends_with('\u{FFFD}');
        if window.len() <= released.len() || !(complete || force) {
            return Ok(String::new());
        }
        let delta = match window.get(released.len()..) {
            Some(delta) if window.starts_with(&released) => delta.to_owned(),
            // The window decoded differently from its prefix (a merge across the boundary);
            // release the whole difference in characters rather than bytes.
            _ => window.chars().skip(released.chars().count()).collect(),
        };
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(delta)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn tokenizer() -> Tokenizer {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/inferno-tiny/tokenizer.json");
        Tokenizer::from_file(path).expect("fixture tokenizer loads")
    }

    #[test]
    fn multibyte_characters_split_across_tokens_are_never_torn() {
        let tokenizer = tokenizer();
        let text = "Ünïcödé ✓ 中文 🚀 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 bytes";
        let ids = tokenizer
            .encode(text, false)
            .expect("encodes")
            .get_ids()
            .to_vec();
        assert!(
            ids.len() > text.chars().count() / 2,
            "byte-level pieces: {}",
            ids.len()
        );
        let mut decoder = IncrementalDecoder::new();
        let mut out = String::new();
        for id in ids {
            let delta = decoder.push(&tokenizer, id).expect("decodes");
            assert!(
                !delta.contains('\u{FFFD}'),
                "a torn character was released: {delta:?}"
            );
            out.push_str(&delta);
        }
        out.push_str(&decoder.finish(&tokenizer).expect("decodes"));
        assert_eq!(out, text);
    }

    #[test]
    fn invalid_utf8_from_the_model_does_not_stall_the_stream() {
        let tokenizer = tokenizer();
        // A token that is a lone continuation byte never completes a character.
        let lone_byte = (0..tokenizer.get_vocab_size(true) as u32)
            .find(|&id| {
                tokenizer
                    .decode(&[id], false)
                    .is_ok_and(|t| t == "\u{FFFD}")
            })
            .expect("the byte-level vocabulary has lone continuation bytes");
        let mut decoder = IncrementalDecoder::new();
        let released: String = (0..=MAX_PENDING_TOKENS)
            .map(|_| decoder.push(&tokenizer, lone_byte).expect("decodes"))
            .collect();
        assert!(
            !released.is_empty(),
            "held bytes are released after {MAX_PENDING_TOKENS} tokens"
        );
    }
}
