//! The engines a service runs tasks on, by the kind of model they run.

use std::collections::HashMap;
use std::sync::Arc;

use lmsp_domain::ports::Engine;
use lmsp_domain::EngineKind;

/// The engines, by the kind of model they run.
#[derive(Clone, Default)]
pub struct Engines {
    by_kind: HashMap<EngineKind, Arc<dyn Engine>>,
}

impl std::fmt::Debug for Engines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.by_kind.keys()).finish()
    }
}

impl Engines {
    /// No engine.
    pub fn new() -> Self {
        Self::default()
    }

    /// With `engine` running the models of `kind`.
    pub fn with(mut self, kind: EngineKind, engine: Arc<dyn Engine>) -> Self {
        self.by_kind.insert(kind, engine);
        self
    }

    /// The engine of `kind`, if this service has one.
    pub fn get(&self, kind: EngineKind) -> Option<&Arc<dyn Engine>> {
        self.by_kind.get(&kind)
    }

    /// Whether the service runs models of `kind`.
    pub fn runs(&self, kind: EngineKind) -> bool {
        self.by_kind.contains_key(&kind)
    }

    /// The engine the service was started for: the upstream or llama.cpp engine when it has
    /// one (at most one of them runs beside the reference engine), else the reference engine.
    pub fn primary(&self) -> Option<(EngineKind, &Arc<dyn Engine>)> {
        [
            EngineKind::Upstream,
            EngineKind::Llama,
            EngineKind::Reference,
        ]
        .into_iter()
        .find_map(|kind| self.get(kind).map(|engine| (kind, engine)))
    }
}
