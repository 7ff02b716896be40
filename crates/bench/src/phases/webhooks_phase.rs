//! The webhooks phase: completions per second without a webhook endpoint, and with one whose
//! receiver hangs (`webhooks`), each on a fresh `lmsp serve`; the order alternates between
//! repetitions, so that a drift of the machine's load falls on both.

use anyhow::bail;

use super::{ulid_like, Outcome, Phases};
use crate::results::{Results, WebhookFigures};
use crate::server::{CpuMeter, Server};
use crate::webhooks::{self, HangingReceiver, SERVE_FLAGS};
use crate::{client, peer};

impl Phases<'_> {
    /// Completions per second of `webhook_tasks` background tasks, without a webhook endpoint
    /// and with a hanging receiver subscribed to `response.completed`.
    pub(crate) async fn webhooks_phase(&self) -> anyhow::Result<Outcome> {
        let plan = self.plan;
        let Some(lmsp) = self.lmsp else {
            return Ok(Outcome::Skipped(String::from(
                "needs fresh services and their databases (--url given)",
            )));
        };
        eprintln!("== webhooks: a hanging receiver");
        println!(
            "\n[webhooks] lmsp serve {} (reference engine, zero delays); {} background submits (max_output_tokens 1) from {} concurrent clients, completions/s from the first POST until GET /v1/tasks lists none unfinished; without a webhook endpoint, and with one subscribed to response.completed whose receiver (a TCP listener of the harness) accepts, reads and never answers; a fresh service each, the order alternating per repetition",
            SERVE_FLAGS.join(" "),
            plan.webhook_tasks,
            plan.webhook_clients,
        );
        let mut figures = WebhookFigures::default();
        for rep in 0..plan.reps {
            let order = if rep % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            for hanging in order {
                let dir = self.work_dir.join(format!("webhooks-{}", ulid_like()));
                let server = Server::start(lmsp, &dir, SERVE_FLAGS)?;
                let http = client::http_client()?;
                let hook = if hanging {
                    let receiver = HangingReceiver::start().await?;
                    let endpoint = webhooks::register(&http, &server, receiver.url()).await?;
                    Some((receiver, endpoint))
                } else {
                    None
                };
                let server = std::sync::Arc::new(server);
                let cpu = CpuMeter::start(&server);
                let per_s =
                    peer::lmsp(&http, &server, plan.webhook_tasks, plan.webhook_clients).await?;
                let cpu = cpu.report(&server);
                drop(server);
                match hook {
                    None => {
                        println!(
                            "  rep {rep}: no webhook endpoint: {per_s:.0} completions/s; {cpu}"
                        );
                        figures.without_per_s.push(per_s);
                    }
                    Some((receiver, endpoint)) => {
                        let (written, pending, delivered) =
                            webhooks::count_deliveries(&dir, endpoint, plan.webhook_tasks * 2 + 16)
                                .await?;
                        println!(
                            "  rep {rep}: a hanging receiver: {per_s:.0} completions/s; {cpu}; at the end {written} deliveries written, {pending} pending, {delivered} delivered; the receiver accepted {} connection(s), read {} bytes, answered none",
                            receiver.accepted(),
                            receiver.received()
                        );
                        if written != plan.webhook_tasks {
                            bail!(
                                "{} completions wrote {written} response.completed deliveries",
                                plan.webhook_tasks
                            );
                        }
                        figures.hanging_per_s.push(per_s);
                        figures.pending.push(pending as f64);
                        figures.connections.push(receiver.accepted() as f64);
                    }
                }
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
        Ok(Outcome::Done(Box::new(move |r: &mut Results| {
            r.webhooks = figures;
        })))
    }
}
