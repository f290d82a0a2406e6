//! Stop sequences over a token stream.
//!
//! Text that could be the start of a stop sequence is held back until the
//! next token shows whether it is one, so a stop sequence spanning several
//! tokens is never partly emitted.

/// Matches stop sequences across token boundaries.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

/// What to do after feeding one token.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Emit this text (possibly empty: all of it is held back) and go on.
    Emit(String),
    /// A stop sequence matched: emit this text, then finish with `stop`.
    Stopped(String),
}

impl StopMatcher {
    pub fn new(stops: &[String]) -> Self {
        Self { stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(), held: String::new() }
    }

    pub fn push(&mut self, token: &str) -> Step {
        if self.stops.is_empty() {
            return Step::Emit(token.to_string());
        }
        self.held.push_str(token);
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            self.held.truncate(at);
            return Step::Stopped(std::mem::take(&mut self.held));
        }
        // Hold back the longest suffix that is a prefix of some stop sequence.
        let keep = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| self.stops.iter().any(|s| s.starts_with(&self.held[i..])))
            .unwrap_or(self.held.len());
        let rest = self.held.split_off(keep);
        Step::Emit(std::mem::replace(&mut self.held, rest))
    }

    /// Text still held back when generation ends without a match.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_through_without_stops() {
        let mut m = StopMatcher::new(&[]);
        assert_eq!(m.push("a b"), Step::Emit("a b".into()));
    }

    #[test]
    fn matches_across_tokens_and_never_leaks_the_stop() {
        let mut m = StopMatcher::new(&["END".to_string()]);
        assert_eq!(m.push("hello E"), Step::Emit("hello ".into()));
        assert_eq!(m.push("N"), Step::Emit(String::new()));
        assert_eq!(m.push("D more"), Step::Stopped("".into()));
    }

    #[test]
    fn releases_held_text_when_it_turns_out_not_to_match() {
        let mut m = StopMatcher::new(&["END".to_string()]);
        assert_eq!(m.push("x E"), Step::Emit("x ".into()));
        assert_eq!(m.push("Nx"), Step::Emit("ENx".into()));
        assert_eq!(m.push(" tail E"), Step::Emit(" tail ".into()));
        assert_eq!(m.finish(), "E");
    }
}
