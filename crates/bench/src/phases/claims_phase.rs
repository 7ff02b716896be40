//! The claims phase: SQLite claims per second with a long queue of one client in one tier, and
//! with the same number of tasks spread over the three tiers and many clients, in process
//! through the storage port (`sqlite_claims`); both templates are prepared once per run, each
//! repetition measures both on fresh copies.

use super::{Outcome, Phases};
use crate::results::{ClaimFigures, Results};
use crate::sqlite_claims::{self, Shape};

impl Phases<'_> {
    /// Claims per second, single queue and across tiers, with `claim_queue` tasks queued.
    pub(crate) async fn claims_phase(&self) -> anyhow::Result<Outcome> {
        let plan = self.plan;
        eprintln!("== claims across tiers");
        let shapes = [
            Shape::Single,
            Shape::AcrossTiers {
                clients: plan.claim_clients,
            },
        ];
        let mut figures = ClaimFigures::default();
        let mut templates = Vec::new();
        for (i, shape) in shapes.into_iter().enumerate() {
            let dir = self.work_dir.join(format!("claims-template-{i}"));
            let prepared = sqlite_claims::prepare(&dir, plan.claim_queue, shape).await?;
            println!(
                "\n[claims] {} tasks queued ({}) prepared through SqliteStore (create_task, {} at once, group-committed, synchronous=NORMAL) in {:.1} s = {:.0} creates/s; {:.0} MiB",
                prepared.tasks,
                shape.describe(),
                sqlite_claims::IN_FLIGHT,
                prepared.seconds,
                prepared.tasks as f64 / prepared.seconds.max(1e-9),
                prepared.mib
            );
            match shape {
                Shape::Single => figures.prepare_single_s.push(prepared.seconds),
                Shape::AcrossTiers { .. } => figures.prepare_tiers_s.push(prepared.seconds),
            }
            templates.push((dir, shape, prepared));
        }
        println!(
            "[claims] each repetition: a copy of each, opened as the service does (synchronous=FULL); {} claim loops, each claim_next then a Fail step ending the task (as a worker ends it), {:.1} s warm-up, then {:.1} s counted",
            plan.claim_loops,
            plan.claim_warmup.as_secs_f64(),
            plan.claim_duration.as_secs_f64()
        );
        for rep in 0..plan.reps {
            for (i, (template, shape, prepared)) in templates.iter().enumerate() {
                let dir = self.work_dir.join(format!("claims-{rep}-{i}"));
                let run = sqlite_claims::measure(
                    template,
                    &dir,
                    prepared,
                    plan.claim_loops,
                    plan.claim_warmup,
                    plan.claim_duration,
                )
                .await?;
                let dry = if run.ran_dry {
                    " (the queue ran dry)"
                } else {
                    ""
                };
                println!(
                    "  rep {rep}: {}: {:.0} claims/s ({} claims){dry}; claim_next p50 {:.2} ms, p99 {:.2} ms",
                    shape.describe(),
                    run.per_s,
                    run.claims,
                    run.p50_ms,
                    run.p99_ms
                );
                let (per_s, p50, p99) = match shape {
                    Shape::Single => (
                        &mut figures.single_per_s,
                        &mut figures.single_p50,
                        &mut figures.single_p99,
                    ),
                    Shape::AcrossTiers { .. } => (
                        &mut figures.tiers_per_s,
                        &mut figures.tiers_p50,
                        &mut figures.tiers_p99,
                    ),
                };
                per_s.push(run.per_s);
                p50.push(run.p50_ms);
                p99.push(run.p99_ms);
            }
        }
        for (template, _, _) in &templates {
            let _ = std::fs::remove_dir_all(template);
        }
        Ok(Outcome::Done(Box::new(move |r: &mut Results| {
            r.claims = figures;
        })))
    }
}
