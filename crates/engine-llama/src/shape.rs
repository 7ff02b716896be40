//! What a run's text becomes: output text (held back while it may be the start of a stop string
//! or of a tool call's trigger), or a function call — its name, then its arguments.
//!
//! The [`Shaper`] is a pure function of the text it is fed, token by token, so a resume rebuilds
//! it exactly by feeding it the text of the tokens generated so far (what it returned then was
//! sent already). Each token yields at most one [`Piece`] (a call's start never shares a token
//! with text: the trigger and the name are written by the grammar in tokens of their own, see
//! `steer`), so the state sent with a piece says exactly which pieces were sent.
//!
//! The stop strings and the trigger are each watched by a [`StopWatch`] of `lmsp-engine-kit`
//! (the reference engine's too): text is held back while either may be starting, and a stop
//! string ends the output (and the generation) at the token that completes it.

use lmsp_engine_kit::StopWatch;

/// The text a model writes before a call when it may choose between text and a call: the name
/// (a JSON string) and the arguments (a JSON object) follow, both written under a grammar.
pub(crate) const TRIGGER: &str = "<tool_call>";

/// What the output may be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Text only (perhaps constrained by a format's grammar).
    Text,
    /// Text, or a call of one of `names` after [`TRIGGER`].
    Auto {
        /// The functions the model may call.
        names: Vec<String>,
    },
    /// A call of one of `names`, its name first.
    Choose {
        /// The functions the model must choose from.
        names: Vec<String>,
    },
    /// A call of this function: arguments only.
    Call {
        /// The function.
        name: String,
    },
}

/// A part of the output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    /// Output text.
    Text(String),
    /// A function call starts.
    Call {
        /// The function called.
        name: String,
    },
    /// A piece of the open call's arguments (JSON text).
    Arguments(String),
}

/// Where the output is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Text; `held` is not sent yet (it may start a stop string or the trigger).
    Text { held: String },
    /// A call's name being written (after the trigger, if any).
    Name { written: String },
    /// The call of `name`: arguments.
    Arguments,
    /// A stop string was written: the output is over.
    Stopped,
}

/// What feeding one token's text did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Step {
    /// What to send.
    pub(crate) pieces: Vec<Piece>,
    /// The call whose arguments start now (the grammar changes to its parameters').
    pub(crate) arguments_of: Option<String>,
    /// A stop string was written: generation ends.
    pub(crate) stopped: bool,
}

/// The shaping of one run's output.
#[derive(Debug, Clone)]
pub(crate) struct Shaper {
    /// The stop strings over the text.
    stops: StopWatch,
    /// The names a call may have (empty: no call).
    names: Vec<String>,
    /// [`TRIGGER`] over the text, when text may turn into a call there.
    trigger: Option<StopWatch>,
    phase: Phase,
}

impl Shaper {
    /// A shaper of output in `mode`, ending text before the first of `stops`; and the pieces
    /// that come before any token (a named call's start).
    pub(crate) fn new(mode: Mode, stops: Vec<String>) -> (Self, Step) {
        let mut first = Step::default();
        let (names, watch_trigger, phase) = match mode {
            Mode::Text => (
                Vec::new(),
                false,
                Phase::Text {
                    held: String::new(),
                },
            ),
            Mode::Auto { names } => (
                names,
                true,
                Phase::Text {
                    held: String::new(),
                },
            ),
            Mode::Choose { names } => (
                names,
                false,
                Phase::Name {
                    written: String::new(),
                },
            ),
            Mode::Call { name } => {
                first.pieces.push(Piece::Call { name: name.clone() });
                first.arguments_of = Some(name.clone());
                (vec![name], false, Phase::Arguments)
            }
        };
        (
            Self {
                stops: StopWatch::new(&stops),
                names,
                trigger: watch_trigger.then(|| StopWatch::new(&[TRIGGER.to_owned()])),
                phase,
            },
            first,
        )
    }

    /// Whether the output is a call's arguments now.
    pub(crate) fn in_call(&self) -> bool {
        matches!(self.phase, Phase::Name { .. } | Phase::Arguments)
    }

    /// Feeds the text of one token.
    pub(crate) fn feed(&mut self, text: &str) -> Step {
        let mut step = Step::default();
        match &mut self.phase {
            Phase::Stopped => {}
            Phase::Arguments => {
                if !text.is_empty() {
                    step.pieces.push(Piece::Arguments(text.to_owned()));
                }
            }
            Phase::Name { written } => {
                written.push_str(text);
                let written = std::mem::take(written);
                self.name_written(written, &mut step);
            }
            Phase::Text { held } => {
                held.push_str(text);
                let held = std::mem::take(held);
                // The watches hold no more than `held` ends with: where they met a stop string
                // or the trigger is as far from its end.
                let stop = self
                    .stops
                    .feed(text)
                    .map(|from| held.len().saturating_sub(from));
                let trigger = self
                    .trigger
                    .as_mut()
                    .and_then(|trigger| trigger.feed(text))
                    .map(|from| held.len().saturating_sub(from));
                match (stop, trigger) {
                    (Some(at), trigger) if trigger.is_none_or(|t| at <= t) => {
                        if at > 0 {
                            step.pieces.push(Piece::Text(held[..at].to_owned()));
                        }
                        self.phase = Phase::Stopped;
                        step.stopped = true;
                    }
                    (_, Some(at)) => {
                        if at > 0 {
                            step.pieces.push(Piece::Text(held[..at].to_owned()));
                        }
                        self.name_written(held[at + TRIGGER.len()..].to_owned(), &mut step);
                    }
                    _ => {
                        let trigger = self.trigger.as_ref().map_or(0, StopWatch::held);
                        let keep = self.stops.held().max(trigger);
                        let (send, keep) = held.split_at(held.len() - keep);
                        if !send.is_empty() {
                            step.pieces.push(Piece::Text(send.to_owned()));
                        }
                        self.phase = Phase::Text {
                            held: keep.to_owned(),
                        };
                    }
                }
            }
        }
        step
    }

    /// The name written so far: a call starts once it is a whole JSON string naming a function.
    fn name_written(&mut self, written: String, step: &mut Step) {
        let trimmed = written.trim_start();
        if trimmed.starts_with('"') {
            let mut strings = serde_json::Deserializer::from_str(trimmed).into_iter::<String>();
            if let Some(Ok(name)) = strings.next() {
                if self.names.contains(&name) {
                    let rest = trimmed[strings.byte_offset()..].trim_start().to_owned();
                    step.pieces.push(Piece::Call { name: name.clone() });
                    if !rest.is_empty() {
                        step.pieces.push(Piece::Arguments(rest));
                    }
                    step.arguments_of = Some(name);
                    self.phase = Phase::Arguments;
                    return;
                }
            }
        }
        self.phase = Phase::Name { written };
    }

    /// The text still held back when the output ends (none was a stop string's start).
    pub(crate) fn finish(&mut self) -> Option<Piece> {
        match &mut self.phase {
            Phase::Text { held } if !held.is_empty() => Some(Piece::Text(std::mem::take(held))),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed_all(shaper: &mut Shaper, texts: &[&str]) -> Vec<Piece> {
        let mut pieces = Vec::new();
        for text in texts {
            pieces.extend(shaper.feed(text).pieces);
        }
        pieces.extend(shaper.finish());
        pieces
    }

    fn text(s: &str) -> Piece {
        Piece::Text(s.to_owned())
    }

    #[test]
    fn text_ends_before_the_first_stop_string_and_its_start_is_held_back() {
        let (mut shaper, first) = Shaper::new(Mode::Text, vec!["END".into(), String::new()]);
        assert_eq!(first, Step::default());
        let step = shaper.feed("hello E");
        assert_eq!(step.pieces, vec![text("hello ")]);
        let step = shaper.feed("Nx");
        assert_eq!(step.pieces, vec![text("ENx")]);
        let step = shaper.feed(" and EN");
        assert_eq!(step.pieces, vec![text(" and ")]);
        let step = shaper.feed("D more");
        assert!(step.stopped);
        assert!(step.pieces.is_empty());
        assert_eq!(shaper.feed("ignored"), Step::default());
        assert_eq!(shaper.finish(), None);
    }

    #[test]
    fn held_back_text_is_sent_at_the_end() {
        let (mut shaper, _) = Shaper::new(Mode::Text, vec!["stop".into()]);
        assert_eq!(
            feed_all(&mut shaper, &["a st"]),
            vec![text("a "), text("st")]
        );
    }

    #[test]
    fn text_turns_into_a_call_at_the_trigger() {
        let names = vec!["get_weather".to_owned(), "get".to_owned()];
        let (mut shaper, _) = Shaper::new(Mode::Auto { names }, Vec::new());
        assert_eq!(
            shaper.feed("Let me check.<tool").pieces,
            vec![text("Let me check.")]
        );
        assert!(!shaper.in_call());
        assert!(shaper.feed("_call>").pieces.is_empty());
        assert!(shaper.in_call());
        assert!(shaper.feed(" \"get").pieces.is_empty());
        let step = shaper.feed("_weather\"");
        assert_eq!(
            step.pieces,
            vec![Piece::Call {
                name: "get_weather".into()
            }]
        );
        assert_eq!(step.arguments_of.as_deref(), Some("get_weather"));
        assert_eq!(
            shaper.feed("{\"city\"").pieces,
            vec![Piece::Arguments("{\"city\"".into())]
        );
        assert_eq!(shaper.finish(), None);
    }

    #[test]
    fn a_chosen_call_starts_with_its_name_and_a_named_call_at_once() {
        let (mut shaper, first) = Shaper::new(
            Mode::Choose {
                names: vec!["a".into(), "b".into()],
            },
            Vec::new(),
        );
        assert!(first.pieces.is_empty());
        assert_eq!(
            shaper.feed("\"b\"").pieces,
            vec![Piece::Call { name: "b".into() }]
        );
        let (_, first) = Shaper::new(Mode::Call { name: "f".into() }, Vec::new());
        assert_eq!(first.pieces, vec![Piece::Call { name: "f".into() }]);
        assert_eq!(first.arguments_of.as_deref(), Some("f"));
    }
}
