//! The stop watch: whether a generation's text has written one of its task's stop strings yet,
//! so an engine that makes the text in process ends the generation at the token that completes
//! the first one (its usage then counts the tokens up to and including that one), as OpenAI's
//! engines do. The app still decides what text is written (it cuts the text before the stop
//! string); the engine only stops working.
//!
//! The watch keeps the tail of the text that may be the start of a stop string (never more than
//! the longest stop string less one byte), so its memory is bounded whatever the length of the
//! output, and it is rebuilt exactly on a resume from the text produced up to the resume point
//! ([`StopWatch::resumed`]): the tail it keeps depends only on the text so far, not on how that
//! text was cut into deltas.

use lmsp_domain::tools::{stop_at, stop_holdback, Controls};

/// Watches the text of one generation for a set of stop strings.
#[derive(Debug, Clone)]
pub struct StopWatch {
    /// The stop strings, none empty.
    stops: Vec<String>,
    /// The end of the text so far that may be the start of a stop string.
    tail: String,
    /// A stop string was written.
    met: bool,
}

impl StopWatch {
    /// A watch of `stops` over a text not yet begun (empty strings are never met).
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            tail: String::new(),
            met: false,
        }
    }

    /// A watch of the stop strings of a task's `controls`, over a text not yet begun.
    pub fn of(controls: &Controls) -> Self {
        Self::new(&controls.stop)
    }

    /// A watch of `controls`' stop strings as it stands after `text_so_far` (a resumed
    /// generation's text up to its resume point): the same as one fed that text piece by piece.
    pub fn resumed(controls: &Controls, text_so_far: &str) -> Self {
        let mut watch = Self::of(controls);
        watch.feed(text_so_far);
        watch
    }

    /// Whether the watch has stop strings at all (without, it is never met).
    pub fn is_active(&self) -> bool {
        !self.stops.is_empty()
    }

    /// Takes the next piece of text. When it completes a stop string (the earliest one, when
    /// several), returns how many bytes of the text from the start of that stop string to the end
    /// of `text` there are (it may have begun in earlier pieces); from then on the watch is met
    /// and takes nothing more.
    pub fn feed(&mut self, text: &str) -> Option<usize> {
        if self.met || !self.is_active() {
            return None;
        }
        self.tail.push_str(text);
        if let Some(at) = stop_at(&self.stops, &self.tail) {
            self.met = true;
            let from_stop = self.tail.len() - at;
            self.tail.clear();
            return Some(from_stop);
        }
        let keep = stop_holdback(&self.stops, &self.tail);
        self.tail.drain(..self.tail.len() - keep);
        None
    }

    /// Whether a stop string has been written.
    pub fn is_met(&self) -> bool {
        self.met
    }

    /// How many bytes at the end of the text so far may be the start of a stop string (what a
    /// writer of the text must hold back until the next piece shows whether one follows).
    pub fn held(&self) -> usize {
        self.tail.len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn stops(stops: &[&str]) -> Controls {
        Controls {
            stop: stops.iter().map(|s| (*s).to_owned()).collect(),
            ..Controls::default()
        }
    }

    #[test]
    fn a_stop_string_across_pieces_is_met_at_the_piece_that_completes_it() {
        let mut watch = StopWatch::of(&stops(&["village", "END"]));
        assert_eq!(watch.feed("the old vil"), None);
        assert_eq!(watch.held(), "vil".len());
        assert_eq!(watch.feed("la"), None);
        assert_eq!(watch.feed("ge and more"), Some("village and more".len()));
        assert!(watch.is_met());
        // Met: nothing more is taken.
        assert_eq!(watch.feed("END"), None);
        assert!(watch.is_met());
    }

    #[test]
    fn the_earliest_stop_string_counts_and_memory_stays_bounded() {
        let mut watch = StopWatch::of(&stops(&["abcd", "bc"]));
        assert_eq!(watch.feed("xxa"), None);
        // "abcd" starts first (in the earlier piece), though "bc" ends first.
        assert_eq!(watch.feed("bcd"), Some("abcd".len()));
        let mut long = StopWatch::of(&stops(&["never"]));
        for _ in 0..1000 {
            assert_eq!(long.feed("a long text without it "), None);
            assert!(long.held() < "never".len());
        }
        let mut none = StopWatch::of(&Controls::default());
        assert!(!none.is_active());
        assert_eq!(none.feed("anything"), None);
        let mut empty = StopWatch::new(&[String::new()]);
        assert!(!empty.is_active());
        assert_eq!(empty.feed("x"), None);
    }

    #[test]
    fn a_resumed_watch_is_the_watch_fed_the_text_so_far() {
        let controls = stops(&["é!", "stop here"]);
        let text = "words, then stop he";
        let resumed = StopWatch::resumed(&controls, text);
        let mut fed = StopWatch::of(&controls);
        for piece in ["words, ", "then st", "op he"] {
            assert_eq!(fed.feed(piece), None);
        }
        assert_eq!(resumed.tail, fed.tail);
        assert_eq!(resumed.held(), "stop he".len());
        let mut resumed = resumed;
        assert_eq!(resumed.feed("re."), Some("stop here.".len()));
        // Multi-byte characters: the tail starts at a character boundary.
        let resumed = StopWatch::resumed(&controls, "café");
        assert_eq!(resumed.held(), "é".len());
        // A text that already holds a stop string is met.
        assert!(StopWatch::resumed(&controls, "stop here and on").is_met());
    }
}
