//! The PostgreSQL phase: `pgbench`'s insert-commit ceiling of the cluster, then per repetition
//! background submits on one instance (closed loop, then paced at half its peak beside pgbench
//! paced at the same rate) and on several sharing one database, persisted events on one instance
//! beside SQLite's on the same workload, streams spread over several instances, and claims, each
//! on a fresh database.

use std::path::Path;
use std::sync::Arc;

use super::{ulid_like, Outcome, Phases};
use crate::results::{push_level, PgFigures, Results};
use crate::server::{CpuMeter, Server};
use crate::submit::{self, Request};
use crate::{client, events, pg_claims, pg_streams, postgres};

impl Phases<'_> {
    /// Submits on PostgreSQL: `pgbench`'s insert-commit ceiling, then per repetition one
    /// instance, three instances on one database, and (one instance) persisted events, each on a
    /// fresh database.
    pub(crate) async fn postgres_phase(&self, explicit: bool) -> anyhow::Result<Outcome> {
        let plan = self.plan;
        let refuse = |why: String| -> anyhow::Result<Outcome> {
            if explicit {
                anyhow::bail!("--only postgres was asked for, but {why}")
            }
            Ok(Outcome::Skipped(why))
        };
        let Some(lmsp) = self.lmsp else {
            return refuse(String::from(
                "the PostgreSQL figures start their own lmsp serve instances (--url given)",
            ));
        };
        if let Some(why) = postgres::unavailable(self.postgres_bin, self.postgres_url) {
            return refuse(format!("no PostgreSQL is available: {why}"));
        }
        eprintln!("== PostgreSQL");
        let pg = match self.postgres_url {
            Some(url) => postgres::Postgres::external(url, self.postgres_bin)?,
            None => postgres::Postgres::start_cluster(self.postgres_bin)?,
        };
        let mut serve: Vec<&str> = submit::SERVE_FLAGS.to_vec();
        serve.extend(PG_FLAGS);
        let serve = &serve;
        println!(
            "\n[postgres] on {}; ceiling: pgbench -n -c {} -j {} -T {} -f (one single-row INSERT per transaction); figures: lmsp serve --database URL --instance NAME {} on a fresh database per repetition, {} closed-loop clients (round-robin over the instances), then (one instance) paced at half the peak beside pgbench -R at the same rate; events: lmsp serve --database URL --workers {}, {} tasks × max_output_tokens {} posted with stream: true, and the same on SQLite; streams: {} instances with --workers {} --reference-load-delay {}, {} tasks posted round-robin, each streamed (GET /v1/tasks/ID/events) from the next instance",
            pg.description,
            plan.pg_clients,
            plan.pgbench_threads,
            plan.pgbench_seconds,
            serve.join(" "),
            plan.pg_clients,
            plan.stream_tasks,
            plan.stream_tasks,
            plan.pg_stream_tokens,
            plan.pg_instances,
            plan.pg_streams.div_ceil(plan.pg_instances.max(1)),
            plan.pg_streams_load_delay,
            plan.pg_streams,
        );
        let mut figures = PgFigures {
            described: pg.description.clone(),
            ..PgFigures::default()
        };
        for rep in 0..plan.reps {
            let tps = pg
                .pgbench(
                    self.work_dir,
                    plan.pg_clients,
                    plan.pgbench_threads,
                    plan.pgbench_seconds,
                )
                .await?;
            println!(
                "  rep {rep}: pgbench {} clients: {tps:.0} insert commits/s",
                plan.pg_clients
            );
            figures.ceiling_tps.push(tps);

            for instances in [1, plan.pg_instances] {
                let (run, paced, cpu) = pg
                    .in_fresh_database(&format!("submit{instances}"), |url| async move {
                        self.pg_submits(lmsp, &url, instances, serve).await
                    })
                    .await?;
                println!(
                    "  rep {rep}: {instances} instance(s), {} clients: {:>8.0} submits/s, p50 {:>7.2} ms, p99 {:>7.2} ms, errors {}; {cpu}",
                    plan.pg_clients, run.per_s, run.p50_ms, run.p99_ms, run.errors
                );
                let level = if instances == 1 {
                    &mut figures.one
                } else {
                    &mut figures.three
                };
                push_level(level, &run);
                if let Some(paced) = paced {
                    let bench = pg
                        .pgbench_paced(
                            self.work_dir,
                            plan.pg_clients,
                            plan.pgbench_threads,
                            plan.pgbench_seconds,
                            paced.target_per_s,
                        )
                        .await?;
                    println!(
                        "  rep {rep}: paced at {:.0}/s (half the peak): achieved {:.0}/s, p50 {:.2} ms, p99 {:.2} ms, errors {}; pgbench -R {:.0} ({} clients): {:.0}/s, p50 {:.2} ms, p99 {:.2} ms (start → end)",
                        paced.target_per_s, paced.per_s, paced.p50_ms, paced.p99_ms, paced.errors,
                        paced.target_per_s, plan.pg_clients, bench.per_s, bench.p50_ms, bench.p99_ms
                    );
                    figures.half_peak_rate.push(paced.target_per_s);
                    figures.half_peak_p99.push(paced.p99_ms);
                    figures.half_peak_errors += paced.errors;
                    figures.pgbench_paced_p99.push(bench.p99_ms);
                }
            }

            let (run, cpu) = pg
                .in_fresh_database(
                    "events",
                    |url| async move { self.pg_events(lmsp, &url).await },
                )
                .await?;
            println!(
                "  rep {rep}: events, {} tasks: {} events in {:.2} s = {:.0} events/s; created_at → arrival p50 {:.1} ms, p99 {:.1} ms; {cpu}",
                plan.stream_tasks, run.events, run.seconds, run.per_s, run.delay_p50_ms, run.delay_p99_ms
            );
            figures.events_per_s.push(run.per_s);
            figures.events_delay_p50.push(run.delay_p50_ms);
            figures.events_delay_p99.push(run.delay_p99_ms);

            let (run, cpu) = self.sqlite_events().await?;
            println!(
                "  rep {rep}: events on SQLite, same workload: {} events in {:.2} s = {:.0} events/s; created_at → arrival p50 {:.1} ms, p99 {:.1} ms; {cpu}",
                run.events, run.seconds, run.per_s, run.delay_p50_ms, run.delay_p99_ms
            );
            figures.sqlite_events_per_s.push(run.per_s);

            let (run, cpu) = pg
                .in_fresh_database(
                    "streams",
                    |url| async move { self.pg_streams(lmsp, &url).await },
                )
                .await?;
            println!(
                "  rep {rep}: {} streams over {} instances (each on another instance than its task's POST), {} tokens: {} events = {:.0} events/s; created_at → arrival p50 {:.1} ms, p99 {:.1} ms; {cpu}",
                run.streams, plan.pg_instances, plan.pg_stream_tokens, run.events, run.per_s, run.delay_p50_ms, run.delay_p99_ms
            );
            figures.streams_per_s.push(run.per_s);
            figures.streams_delay_p50.push(run.delay_p50_ms);
            figures.streams_delay_p99.push(run.delay_p99_ms);

            let run = self.pg_claims(&pg, 1).await;
            let (one, three) = run?;
            println!(
                "  rep {rep}: claims, {} queued, {} claim loops per instance: one instance {:.0}/s, {} instances {:.0}/s ({} and {} claims came back empty with tasks queued, and were tried again)",
                plan.pg_claim_queue, plan.pg_claimers, one.per_s, plan.pg_instances, three.per_s, one.empty, three.empty
            );
            figures.claims_one.push(one.per_s);
            figures.claims_three.push(three.per_s);
        }
        if pg.is_owned() {
            eprintln!("  stopping and removing the cluster");
        }
        drop(pg);
        Ok(Outcome::Done(Box::new(move |r: &mut Results| {
            r.pg = figures;
        })))
    }

    /// Starts `instances` instances on the database at `url` (the first alone: it creates the
    /// schema and prints the admin token; then the others) and runs the closed-loop submits
    /// across them; on one instance, then a run paced at half the peak just measured.
    async fn pg_submits(
        &self,
        lmsp: &Path,
        url: &str,
        instances: usize,
        serve: &[&str],
    ) -> anyhow::Result<(submit::LevelRun, Option<submit::PacedRun>, String)> {
        let plan = self.plan;
        let mut servers: Vec<Arc<Server>> = Vec::with_capacity(instances);
        let mut token = String::new();
        for i in 1..=instances {
            let name = format!("bench-{i}");
            let mut flags = serve.to_vec();
            flags.extend(["--database", url, "--instance", &name]);
            let dir = self.work_dir.join(format!("pg-{}", ulid_like()));
            let mut server = Server::start(lmsp, &dir, &flags)?;
            if server.token.is_empty() {
                server.token.clone_from(&token);
            } else {
                token.clone_from(&server.token);
            }
            servers.push(Arc::new(server));
        }
        if token.is_empty() {
            anyhow::bail!("no instance printed the admin token of the fresh database");
        }
        let http = client::http_client()?;
        submit::closed_loop_across(&http, &servers, 16, plan.warmup, Request::Submit).await?;
        let cpus: Vec<CpuMeter> = servers.iter().map(|s| CpuMeter::start(s)).collect();
        let run = submit::closed_loop_across(
            &http,
            &servers,
            plan.pg_clients,
            plan.submit_duration,
            Request::Submit,
        )
        .await?;
        let cpu: Vec<String> = cpus
            .iter()
            .zip(&servers)
            .map(|(meter, server)| meter.report(server))
            .collect();
        let paced = match servers.as_slice() {
            [one] => {
                Some(submit::paced(&http, one, run.per_s / 2.0, plan.submit_duration, 256).await?)
            }
            _ => None,
        };
        Ok((run, paced, cpu.join("; ")))
    }

    /// Claims per second with `pg_claim_queue` tasks queued in `clients` clients: one instance,
    /// then `pg_instances`, each on a queue of its own in a fresh database. The second run does
    /// not start on what the first left: the tasks the first claimed would still be running
    /// (nothing ends them), and a claim reads its client's running tasks.
    async fn pg_claims(
        &self,
        pg: &postgres::Postgres,
        clients: usize,
    ) -> anyhow::Result<(pg_claims::ClaimRun, pg_claims::ClaimRun)> {
        let one = self.claims_on_a_fresh_queue(pg, clients, 1).await?;
        let three = self
            .claims_on_a_fresh_queue(pg, clients, self.plan.pg_instances)
            .await?;
        Ok((one, three))
    }

    /// Claims per second of `instances` instances on a fresh database with `pg_claim_queue`
    /// tasks queued in `clients` clients.
    async fn claims_on_a_fresh_queue(
        &self,
        pg: &postgres::Postgres,
        clients: usize,
        instances: usize,
    ) -> anyhow::Result<pg_claims::ClaimRun> {
        let plan = self.plan;
        pg.in_fresh_database(&format!("claims{clients}x{instances}"), |url| async move {
            pg_claims::prepare(&url, plan.pg_claim_queue, 64, clients).await?;
            pg_claims::claims_per_s(
                &url,
                instances,
                plan.pg_claimers,
                plan.pg_claim_duration,
                plan.pg_claim_queue as u64,
            )
            .await
        })
        .await
    }

    /// PostgreSQL claims alone (`--only pg-claims`, not part of the default run): with
    /// `pg_claim_queue` tasks queued in one client's single queue, then the same number across
    /// the three tiers and `claim_clients` clients, claims per second of one instance and then of
    /// `pg_instances` instances on what is left, each on a fresh database. Printed only.
    pub(crate) async fn pg_claims_phase(&self) -> anyhow::Result<Outcome> {
        let plan = self.plan;
        if let Some(why) = postgres::unavailable(self.postgres_bin, self.postgres_url) {
            anyhow::bail!("--only pg-claims was asked for, but no PostgreSQL is available: {why}");
        }
        eprintln!("== PostgreSQL claims");
        let pg = match self.postgres_url {
            Some(url) => postgres::Postgres::external(url, self.postgres_bin)?,
            None => postgres::Postgres::start_cluster(self.postgres_bin)?,
        };
        println!(
            "\n[pg-claims] on {}; {} tasks queued through PostgresStore (create_task, 64 at a time); {} claim loops per instance, each claiming a task and then ending it (a `Fail` step) as a worker would, {:.1} s per run or until the queue runs dry, each run on a fresh queue",
            pg.description,
            plan.pg_claim_queue,
            plan.pg_claimers,
            plan.pg_claim_duration.as_secs_f64()
        );
        for rep in 0..plan.reps {
            for clients in [1, plan.claim_clients] {
                let started = std::time::Instant::now();
                let (one, three) = self.pg_claims(&pg, clients).await?;
                let took = started.elapsed().as_secs_f64();
                let shape = if clients == 1 {
                    String::from("one client, default tier")
                } else {
                    format!("{clients} clients × 3 tiers")
                };
                println!(
                    "  rep {rep}: {shape}: two fresh queues prepared and claimed in {took:.1} s; one instance {:.0} claims/s, {} instances {:.0} claims/s ({:.0} %); {} and {} claims came back empty with tasks queued, and were tried again",
                    one.per_s,
                    plan.pg_instances,
                    three.per_s,
                    100.0 * three.per_s / one.per_s.max(1e-9),
                    one.empty,
                    three.empty
                );
            }
        }
        drop(pg);
        Ok(Outcome::Done(Box::new(|_: &mut Results| {})))
    }

    /// Persisted events with `stream_tasks` tasks streaming on one instance on `url`.
    async fn pg_events(
        &self,
        lmsp: &Path,
        url: &str,
    ) -> anyhow::Result<(events::EventsRun, String)> {
        let plan = self.plan;
        let mut flags = events::serve_flags(plan.stream_tasks);
        flags.extend(["--database", url, "--instance", "bench-events"].map(String::from));
        flags.extend(PG_FLAGS.iter().map(|flag| String::from(*flag)));
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let dir = self.work_dir.join(format!("pg-events-{}", ulid_like()));
        let server = Arc::new(Server::start(lmsp, &dir, &flags)?);
        let http = client::http_client()?;
        let cpu = CpuMeter::start(&server);
        let run = events::run(&http, &server, plan.stream_tasks, plan.pg_stream_tokens).await?;
        Ok((run, cpu.report(&server)))
    }

    /// SQLite's persisted events on the workload of the PostgreSQL events figure (the same tasks
    /// and tokens), on a fresh data directory: the comparison of the same run.
    async fn sqlite_events(&self) -> anyhow::Result<(events::EventsRun, String)> {
        let plan = self.plan;
        let flags = events::serve_flags(plan.stream_tasks);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let server = self.server("pg-sqlite-events", &flags)?;
        let http = client::http_client()?;
        let cpu = CpuMeter::start(&server);
        let run = events::run(&http, &server, plan.stream_tasks, plan.pg_stream_tokens).await?;
        Ok((run, cpu.report(&server)))
    }

    /// `pg_streams` streams over `pg_instances` instances on `url`, each following a task posted
    /// to another instance; every instance has a worker per stream it may run and a model load
    /// of `pg_streams_load_delay` first.
    async fn pg_streams(
        &self,
        lmsp: &Path,
        url: &str,
    ) -> anyhow::Result<(pg_streams::StreamsRun, String)> {
        let plan = self.plan;
        let workers = plan
            .pg_streams
            .div_ceil(plan.pg_instances.max(1))
            .to_string();
        let mut servers: Vec<Arc<Server>> = Vec::with_capacity(plan.pg_instances);
        let mut token = String::new();
        for i in 1..=plan.pg_instances.max(2) {
            let name = format!("streams-{i}");
            let mut flags = vec!["--workers", &workers];
            flags.extend(["--reference-load-delay", plan.pg_streams_load_delay]);
            flags.extend(["--database", url, "--instance", &name]);
            flags.extend(PG_FLAGS);
            let dir = self.work_dir.join(format!("pg-streams-{}", ulid_like()));
            let mut server = Server::start(lmsp, &dir, &flags)?;
            if server.token.is_empty() {
                server.token.clone_from(&token);
            } else {
                token.clone_from(&server.token);
            }
            servers.push(Arc::new(server));
        }
        let http = client::http_client()?;
        let cpus: Vec<CpuMeter> = servers.iter().map(|s| CpuMeter::start(s)).collect();
        let run = pg_streams::run(&http, &servers, plan.pg_streams, plan.pg_stream_tokens).await?;
        let cpu: Vec<String> = cpus
            .iter()
            .zip(&servers)
            .map(|(meter, server)| meter.report(server))
            .collect();
        Ok((run, cpu.join("; ")))
    }
}

/// The flags every PostgreSQL instance gets beyond its figure's (and `--database`, `--instance`).
const PG_FLAGS: &[&str] = &["--lease", "10s"];
