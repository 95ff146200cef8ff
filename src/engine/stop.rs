//! Stop strings: text that ends a generation and is never emitted, even when it spans tokens.
//!
//! Text that could still turn out to be the start of a stop string is held back until the next
//! token settles it.

/// What to do with newly decoded text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopOutcome {
    /// Emit this text and keep generating.
    Continue(String),
    /// Emit this text (what preceded the stop string) and finish.
    Stopped(String),
}

/// Watches the decoded stream for stop strings.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    /// A matcher for these stop strings (empty strings are ignored).
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
        }
    }

    /// Feeds newly decoded text.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        if self.stops.is_empty() {
            return StopOutcome::Continue(text.to_owned());
        }
        self.held.push_str(text);
        let first_match = self
            .stops
            .iter()
            .filter_map(|stop| self.held.find(stop.as_str()))
            .min();
        if let Some(at) = first_match {
            let emitted = self.held[..at].to_owned();
            self.held.clear();
            return StopOutcome::Stopped(emitted);
        }
        let keep = self.longest_partial_suffix();
        let split = self.held.len() - keep;
        let emitted = self.held[..split].to_owned();
        self.held.drain(..split);
        StopOutcome::Continue(emitted)
    }

    /// Releases the held text when generation ends for another reason.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length in bytes of the longest suffix of the held text that is a proper prefix of a stop
    /// string (always on a character boundary).
    fn longest_partial_suffix(&self) -> usize {
        self.held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let suffix = &self.held[i..];
                self.stops
                    .iter()
                    .any(|stop| stop.len() > suffix.len() && stop.starts_with(suffix))
            })
            .map_or(0, |i| self.held.len() - i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(stops: &[&str]) -> StopMatcher {
        StopMatcher::new(&stops.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn passes_text_through_without_stops() {
        let mut m = matcher(&[]);
        assert_eq!(m.push("abc"), StopOutcome::Continue("abc".into()));
    }

    #[test]
    fn stop_string_spanning_tokens_is_never_emitted() {
        let mut m = matcher(&["END"]);
        assert_eq!(m.push("hello E"), StopOutcome::Continue("hello ".into()));
        assert_eq!(m.push("N"), StopOutcome::Continue(String::new()));
        assert_eq!(m.push("D and more"), StopOutcome::Stopped(String::new()));
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
        assert_eq!(m.push("!b"), StopOutcome::Stopped(String::new()));
    }
}
