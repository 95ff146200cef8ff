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
