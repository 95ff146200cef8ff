//! Stop strings: text that ends a generation and is never emitted, even when it spans tokens.
//!
//! The stop strings are compiled into one Aho-Corasick automaton, and the decoded stream is fed
//! through it byte by byte as it arrives, so the work per token is proportional to the token's
//! text, not to the output so far or to the number of stop strings. Text that could still turn
//! out to be the start of a stop string is held back until the next token settles it.

use std::collections::HashMap;
use std::sync::Arc;

use aho_corasick::automaton::{Automaton, StateID};
use aho_corasick::nfa::noncontiguous::NFA;
use aho_corasick::{Anchored, MatchKind};

/// The most bytes a request's stop strings may hold together (the automaton and the text held
/// back grow with it).
pub const MAX_STOP_BYTES: usize = 4096;

/// What to do with newly decoded text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopOutcome {
    /// Emit this text and keep generating.
    Continue(String),
    /// Emit `emitted` (what preceded the stop string) and finish.
    Stopped {
        /// The text before the stop string.
        emitted: String,
        /// The stop string that matched.
        matched: String,
    },
}

/// Why stop strings were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StopError {
    /// Together the stop strings exceed [`MAX_STOP_BYTES`].
    #[error("the stop strings hold {bytes} bytes together, over the limit of {MAX_STOP_BYTES}")]
    TooLong {
        /// Their total size in bytes.
        bytes: usize,
    },
    /// The automaton could not be built.
    #[error("the stop strings cannot be compiled: {0}")]
    Build(String),
}

/// The compiled stop strings, shared by every choice of a request.
#[derive(Debug)]
struct StopAutomaton {
    nfa: NFA,
    /// For every state, the length of the text it stands for: the longest suffix of the stream
    /// that is a prefix of some stop string (what must be held back in that state).
    depth: HashMap<StateID, usize>,
    start: StateID,
}

impl StopAutomaton {
    fn new(stops: &[&str]) -> Result<Self, StopError> {
        let nfa = NFA::builder()
            .match_kind(MatchKind::Standard)
            .build(stops)
            .map_err(|err| StopError::Build(err.to_string()))?;
        let build = |err: aho_corasick::MatchError| StopError::Build(err.to_string());
        let start = nfa.start_state(Anchored::No).map_err(build)?;
        let anchored = nfa.start_state(Anchored::Yes).map_err(build)?;
        // Trie states are shared by both start states: walking each stop string from the
        // anchored start gives every state's depth.
        let mut depth = HashMap::from([(start, 0), (anchored, 0)]);
        for stop in stops {
            let mut state = anchored;
            for (i, &byte) in stop.as_bytes().iter().enumerate() {
                state = nfa.next_state(Anchored::Yes, state, byte);
                depth.insert(state, i + 1);
            }
        }
        Ok(Self { nfa, depth, start })
    }

    /// The length of the longest stop string that ends in `state`, if any does.
    fn longest_match(&self, state: StateID) -> Option<usize> {
        if !self.nfa.is_match(state) {
            return None;
        }
        (0..self.nfa.match_len(state))
            .map(|i| self.nfa.pattern_len(self.nfa.match_pattern(state, i)))
            .max()
    }
}

/// Watches the decoded stream for stop strings.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    automaton: Option<Arc<StopAutomaton>>,
    state: Option<StateID>,
    held: String,
}

impl StopMatcher {
    /// A matcher for these stop strings (empty strings are ignored). Refused when together
    /// they exceed [`MAX_STOP_BYTES`].
    pub fn new(stops: &[String]) -> Result<Self, StopError> {
        let stops: Vec<&str> = stops
            .iter()
            .map(String::as_str)
            .filter(|s| !s.is_empty())
            .collect();
        let bytes = stops.iter().map(|s| s.len()).sum();
        if bytes > MAX_STOP_BYTES {
            return Err(StopError::TooLong { bytes });
        }
        if stops.is_empty() {
            return Ok(Self::default());
        }
        let automaton = StopAutomaton::new(&stops)?;
        Ok(Self {
            state: Some(automaton.start),
            automaton: Some(Arc::new(automaton)),
            held: String::new(),
        })
    }

    /// Feeds newly decoded text it may keep (no copy when there are no stop strings).
    pub fn push_owned(&mut self, text: String) -> StopOutcome {
        if self.automaton.is_none() {
            return StopOutcome::Continue(text);
        }
        self.push(&text)
    }

    /// Feeds newly decoded text.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        let (Some(automaton), Some(mut state)) = (&self.automaton, self.state) else {
            return StopOutcome::Continue(text.to_owned());
        };
        let base = self.held.len();
        self.held.push_str(text);
        for (i, &byte) in text.as_bytes().iter().enumerate() {
            state = automaton.nfa.next_state(Anchored::No, state, byte);
            if let Some(len) = automaton.longest_match(state) {
                // A stop string is valid UTF-8, so it starts on a character boundary, and it
                // lies within the held text and this push (it is no longer than the depth).
                let start = base + i + 1 - len;
                let emitted = self.held[..start].to_owned();
                let matched = self.held[start..start + len].to_owned();
                self.held.clear();
                self.state = Some(automaton.start);
                return StopOutcome::Stopped { emitted, matched };
            }
        }
        self.state = Some(state);
        // The held suffix is a prefix of a stop string, so it starts on a character boundary.
        let keep = automaton.depth.get(&state).copied().unwrap_or(0);
        let split = self.held.len() - keep.min(self.held.len());
        let emitted = self.held[..split].to_owned();
        self.held.drain(..split);
        StopOutcome::Continue(emitted)
    }

    /// Releases the held text when generation ends for another reason.
    pub fn flush(&mut self) -> String {
        if let Some(automaton) = &self.automaton {
            self.state = Some(automaton.start);
        }
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn matcher(stops: &[&str]) -> StopMatcher {
        StopMatcher::new(&stops.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    /// Feeds `pieces` and returns everything emitted and whether it stopped.
    fn run(m: &mut StopMatcher, pieces: &[&str]) -> (String, bool) {
        let mut out = String::new();
        for piece in pieces {
            match m.push(piece) {
                StopOutcome::Continue(text) => out.push_str(&text),
                StopOutcome::Stopped { emitted, .. } => {
                    out.push_str(&emitted);
                    return (out, true);
                }
            }
        }
        out.push_str(&m.flush());
        (out, false)
    }

    #[test]
    fn passes_text_through_without_stops() {
        let mut m = matcher(&[]);
        assert_eq!(m.push("abc"), StopOutcome::Continue("abc".into()));
        assert_eq!(m.push_owned("d".into()), StopOutcome::Continue("d".into()));
        let mut m = matcher(&["END"]);
        assert_eq!(
            m.push_owned("a E".into()),
            StopOutcome::Continue("a ".into())
        );
        assert_eq!(
            m.push_owned("ND".into()),
            StopOutcome::Stopped {
                emitted: String::new(),
                matched: "END".into()
            }
        );
    }

    #[test]
    fn stop_string_spanning_tokens_is_never_emitted() {
        let mut m = matcher(&["END"]);
        assert_eq!(m.push("hello E"), StopOutcome::Continue("hello ".into()));
        assert_eq!(m.push("N"), StopOutcome::Continue(String::new()));
        assert_eq!(
            m.push("D and more"),
            StopOutcome::Stopped {
                emitted: String::new(),
                matched: "END".into()
            }
        );
    }

    #[test]
    fn false_prefix_is_released_once_disproved() {
        let mut m = matcher(&["END"]);
        assert_eq!(m.push("EN"), StopOutcome::Continue(String::new()));
        assert_eq!(m.push("x"), StopOutcome::Continue("ENx".into()));
        assert_eq!(m.push("E"), StopOutcome::Continue(String::new()));
        assert_eq!(m.flush(), "E");
    }

    #[test]
    fn earliest_of_several_stops_wins_and_multibyte_is_safe() {
        let mut m = matcher(&["ß!", "b"]);
        assert_eq!(m.push("aß"), StopOutcome::Continue("a".into()));
        assert_eq!(
            m.push("!b"),
            StopOutcome::Stopped {
                emitted: String::new(),
                matched: "ß!".into()
            }
        );
    }

    #[test]
    fn a_shorter_stop_inside_a_longer_partial_one_holds_the_longer_prefix() {
        // "abcX" is partly matched when "bcd" completes: the text before "bcd" is emitted.
        let mut m = matcher(&["abcX", "bcd"]);
        assert_eq!(run(&mut m, &["ab", "c", "d"]), ("a".into(), true));
        let mut m = matcher(&["abcX", "bcd"]);
        assert_eq!(run(&mut m, &["abc", "Y"]), ("abcY".into(), false));
    }

    #[test]
    fn stop_strings_over_the_byte_limit_are_refused() {
        let stops = vec!["x".repeat(MAX_STOP_BYTES / 2 + 1); 2];
        assert!(matches!(
            StopMatcher::new(&stops),
            Err(StopError::TooLong { bytes }) if bytes == MAX_STOP_BYTES + 2
        ));
        assert!(StopMatcher::new(&["x".repeat(MAX_STOP_BYTES)]).is_ok());
    }

    /// Regression for the attack in issue 14: sixteen long stop strings and a long output, fed
    /// one token at a time. Matching the whole held text against every stop string after every
    /// token took seconds; the automaton takes milliseconds.
    #[test]
    fn matching_long_stop_strings_is_linear_in_the_output() {
        let stops: Vec<String> = (0..16)
            .map(|i| format!("{}{i:02}", "a".repeat(MAX_STOP_BYTES / 16 - 2)))
            .collect();
        let mut m = StopMatcher::new(&stops).unwrap();
        let started = std::time::Instant::now();
        let mut emitted = 0;
        // 20,000 single-byte tokens that keep a stop string's prefix pending throughout.
        for _ in 0..20_000 {
            if let StopOutcome::Continue(text) = m.push("a") {
                emitted += text.len();
            }
        }
        let elapsed = started.elapsed();
        assert_eq!(emitted + m.flush().len(), 20_000);
        assert!(
            elapsed < std::time::Duration::from_secs(2),
            "20,000 tokens took {elapsed:?}"
        );
    }

    /// The reference: the earliest-ending stop string (the longest of those ending there) in
    /// the whole text, and everything before it.
    fn reference(stops: &[String], text: &str) -> (String, bool) {
        let mut best: Option<(usize, usize)> = None;
        for end in 1..=text.len() {
            for stop in stops {
                if end >= stop.len() && text.as_bytes()[..end].ends_with(stop.as_bytes()) {
                    let start = end - stop.len();
                    if best.is_none_or(|(_, s)| start < s) {
                        best = Some((end, start));
                    }
                }
            }
            if best.is_some() {
                break;
            }
        }
        match best {
            Some((_, start)) => (text[..start].to_owned(), true),
            None => (text.to_owned(), false),
        }
    }

    proptest! {
        #[test]
        fn agrees_with_a_naive_scan_however_the_text_is_split(
            stops in proptest::collection::vec("[abß]{1,4}", 1..4),
            text in "[abcß]{0,40}",
            cuts in proptest::collection::vec(0usize..40, 0..8),
        ) {
            let mut bounds: Vec<usize> = cuts
                .into_iter()
                .filter(|&c| c <= text.len() && text.is_char_boundary(c))
                .collect();
            bounds.extend([0, text.len()]);
            bounds.sort_unstable();
            bounds.dedup();
            let pieces: Vec<&str> = bounds.windows(2).map(|w| &text[w[0]..w[1]]).collect();
            let mut m = StopMatcher::new(&stops).unwrap();
            prop_assert_eq!(run(&mut m, &pieces), reference(&stops, &text));
        }
    }
}
