//! The samplers with a memory: presence and frequency penalties (which count the tokens
//! generated so far) and the grammar that constrains the output (a format's schema, a call's name,
//! a call's arguments). Both are llama.cpp's own samplers (`llama_sampler_init_penalties`,
//! `llama_sampler_init_grammar` / `_lazy` through llama-cpp-2), applied to the candidates before
//! the seeded draw of `sampling`.
//!
//! Their state is a function of the output tokens alone: a resume rebuilds it by accepting the
//! tokens generated so far, in order, as the uninterrupted run accepted them (`Steer::accept`), so
//! a run killed inside a constrained JSON or a call's arguments continues exactly, under the same
//! grammar state.

use std::collections::HashMap;

use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use llama_cpp_2::token::LlamaToken;
use serde_json::Value;

use crate::schema::{grammar_of, SchemaError};
use crate::shape::{Mode, TRIGGER};

/// The grammar's root rule when a call's name follows the trigger.
const TRIGGERED_ROOT: &str = "lmsp-call";

/// What constrains a run's output, compiled once when it starts.
#[derive(Debug, Clone, Default)]
pub(crate) struct Plan {
    /// The grammar of the output from its first token (a format, or a call), its root `root`.
    pub(crate) grammar: Option<String>,
    /// The grammar of a call after [`TRIGGER`] (tool choice `auto`), root [`TRIGGERED_ROOT`].
    pub(crate) triggered: Option<String>,
    /// Each function's arguments grammar.
    pub(crate) arguments: HashMap<String, String>,
    /// Presence and frequency penalties (0: none).
    pub(crate) presence: f32,
    /// See `presence`.
    pub(crate) frequency: f32,
}

impl Plan {
    /// The grammars of `mode`: `format` (a JSON schema, for text) and each function's
    /// `parameters` (a JSON schema; `None`: any object).
    pub(crate) fn new(
        mode: &Mode,
        format: Option<&Value>,
        parameters: &[(String, Option<Value>)],
    ) -> Result<Self, SchemaError> {
        let mut plan = Plan::default();
        let any_object = serde_json::json!({"type": "object"});
        for (name, schema) in parameters {
            plan.arguments.insert(
                name.clone(),
                grammar_of(schema.as_ref().unwrap_or(&any_object))?,
            );
        }
        let names_grammar = |names: &[String]| grammar_of(&serde_json::json!({ "enum": names }));
        match mode {
            Mode::Text => {
                plan.grammar = format.map(grammar_of).transpose()?;
            }
            Mode::Auto { names } => {
                // The call's name after the trigger (llama.cpp feeds a lazy grammar the text
                // from the trigger on).
                let mut grammar = names_grammar(names)?;
                grammar.push_str(&format!(
                    "\n{TRIGGERED_ROOT} ::= {} [ \\n]? root\n",
                    serde_json::Value::String(TRIGGER.to_owned())
                ));
                plan.triggered = Some(grammar);
            }
            Mode::Choose { names } => plan.grammar = Some(names_grammar(names)?),
            Mode::Call { .. } => {}
        }
        Ok(plan)
    }
}

/// Why a steering sampler failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SteerError {
    /// llama.cpp refused a grammar.
    #[error("llama.cpp cannot parse the grammar of {0}")]
    Grammar(String),
    /// A token the grammar does not allow (a resume state of another request).
    #[error("the output does not follow its grammar")]
    Rejected,
}

/// The penalties and the grammar of one run.
pub(crate) struct Steer<'m> {
    model: &'m LlamaModel,
    penalties: Option<LlamaSampler>,
    grammar: Option<LlamaSampler>,
    arguments: HashMap<String, String>,
}

impl std::fmt::Debug for Steer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Steer")
            .field("penalties", &self.penalties.is_some())
            .field("grammar", &self.grammar.is_some())
            .finish_non_exhaustive()
    }
}

impl<'m> Steer<'m> {
    /// The samplers of `plan` on `model`, penalties counted over up to `window` output tokens.
    pub(crate) fn new(model: &'m LlamaModel, plan: Plan, window: u32) -> Result<Self, SteerError> {
        let penalties = (plan.presence != 0.0 || plan.frequency != 0.0).then(|| {
            LlamaSampler::penalties(
                model.n_vocab(),
                i32::try_from(window).unwrap_or(i32::MAX),
                1.0,
                plan.frequency,
                plan.presence,
            )
        });
        let grammar = match (&plan.grammar, &plan.triggered) {
            (Some(grammar), _) => Some(
                LlamaSampler::grammar(model, grammar, "root")
                    .map_err(|_| SteerError::Grammar(String::from("the output")))?,
            ),
            (None, Some(triggered)) => Some(
                LlamaSampler::grammar_lazy(model, triggered, TRIGGERED_ROOT, [TRIGGER], &[])
                    .map_err(|_| SteerError::Grammar(String::from("a call's name")))?,
            ),
            (None, None) => None,
        };
        Ok(Self {
            model,
            penalties,
            grammar,
            arguments: plan.arguments,
        })
    }

    /// Whether anything is steered (else the candidates go to the draw untouched).
    pub(crate) fn active(&self) -> bool {
        self.penalties.is_some() || self.grammar.is_some()
    }

    /// Penalizes and constrains the candidates of the next token.
    pub(crate) fn apply(&mut self, candidates: &mut LlamaTokenDataArray) {
        if let Some(penalties) = &mut self.penalties {
            candidates.apply_sampler(penalties);
        }
        if let Some(grammar) = &mut self.grammar {
            candidates.apply_sampler(grammar);
        }
    }

    /// Records a generated token (live, or replayed on a resume).
    pub(crate) fn accept(&mut self, token: LlamaToken) -> Result<(), SteerError> {
        if let Some(penalties) = &mut self.penalties {
            penalties.accept(token);
        }
        if let Some(grammar) = &mut self.grammar {
            grammar
                .try_accept(token)
                .map_err(|_| SteerError::Rejected)?;
        }
        Ok(())
    }

    /// The call of `name` starts: from the next token on, its arguments' grammar.
    pub(crate) fn enter_arguments(&mut self, name: &str) -> Result<(), SteerError> {
        let grammar = self
            .arguments
            .get(name)
            .ok_or_else(|| SteerError::Grammar(format!("the arguments of {name}")))?;
        self.grammar = Some(
            LlamaSampler::grammar(self.model, grammar, "root")
                .map_err(|_| SteerError::Grammar(format!("the arguments of {name}")))?,
        );
        Ok(())
    }
}
