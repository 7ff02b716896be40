//! The final tables: the targets, the other figures, the PostgreSQL figures, and the raw
//! ceilings under them.

use std::collections::BTreeMap;

use crate::plan::Plan;
use crate::raw::{Ceilings, PER_COMMIT};
use crate::results::Results;
use crate::stats::{fmt_num, Spread};
use crate::submit;

use super::rows::*;

/// The medians of the raw SQLite ceilings the rows compare with.
struct Medians {
    rows_per_s: f64,
    events_per_s: f64,
    commit_ms: f64,
    single_commits_per_s: f64,
    update_insert_s: f64,
}

impl Medians {
    fn of(c: &Ceilings) -> Self {
        Self {
            rows_per_s: c.rows_per_s.median(),
            events_per_s: c.events_per_s.median(),
            commit_ms: c.commit_ms.median(),
            single_commits_per_s: c.single_commits_per_s.median(),
            update_insert_s: c.update_insert_s.median(),
        }
    }
}

/// Prints the final tables.
pub fn tables(plan: &Plan, r: &Results) {
    let medians = Medians::of(&r.ceilings);
    print_table("## targets", &target_rows(plan, r, &medians));
    let service = if plan.external {
        String::from("the service given by --url")
    } else {
        format!("lmsp serve {}", submit::SERVE_FLAGS.join(" "))
    };
    print_table(
        &format!("## Other figures (submit service: {service})"),
        &other_rows(plan, r, &medians),
    );
    postgres_table(plan, r);
    super::batch_table::batch_table(plan, r);
    super::claims_table::claims_table(plan, r);
    footnotes(plan, r);
}

/// The rows of the README's performance targets.
fn target_rows(plan: &Plan, r: &Results, medians: &Medians) -> Vec<Row> {
    let c = &r.ceilings;
    let Medians {
        rows_per_s: rows_ceiling,
        events_per_s: events_ceiling,
        commit_ms,
        update_insert_s: update_s,
        ..
    } = *medians;
    let empty = Spread::new();
    let problem = |name: &str| r.problems.get(name);

    let mut main = Vec::new();
    let at64 = r.submit.get(&64).map_or(&empty, |level| &level.0);
    main.push(percent_row(
        String::from("durable background submits (202) per second, 64 clients"),
        at64,
        "/s",
        rows_ceiling,
        format!(
            "raw rows/s at {PER_COMMIT} rows per commit: {}",
            n(rows_ceiling)
        ),
        Some(25.0),
        problem("submit"),
    ));
    main.push(percent_row(
        format!(
            "persisted events per second, {} tasks streaming",
            plan.stream_tasks
        ),
        &r.events_per_s,
        "/s",
        events_ceiling,
        format!(
            "raw event appends/s (insert + task update) at {PER_COMMIT} per commit: {}",
            n(events_ceiling)
        ),
        Some(50.0),
        problem("events"),
    ));
    main.push(times_row(
        format!(
            "p99 submit latency at half the peak rate (≈ {}/s)",
            n(r.half_peak_rate.median())
        ),
        &r.half_peak_p99,
        "ms",
        commit_ms,
        format!("one raw fsync'd commit (median): {commit_ms:.2} ms"),
        Some(3.0),
        problem("submit"),
    ));
    main.push(times_row(
        format!(
            "startup recovery of {} leftover tasks (spawn → listening)",
            n(plan.leftovers as f64)
        ),
        &r.recovery_s,
        "s",
        update_s,
        format!(
            "raw update + insert of {} rows in batches of {}: {update_s:.2} s",
            n(c.leftovers as f64),
            n(crate::raw::RECOVERY_BATCH as f64)
        ),
        Some(2.0),
        problem("recovery"),
    ));
    main.push(times_row(
        format!(
            "writer p99 commit latency while purging {} events ({} writers)",
            n(r.purged_events as f64),
            plan.writers
        ),
        &r.writer_purging_p99,
        "ms",
        r.writer_alone_p99.median(),
        format!(
            "the same writers without purge: p99 {} ms",
            fmt_num(r.writer_alone_p99.median(), 2)
        ),
        Some(2.0),
        problem("purge"),
    ));
    main.push(mib_row(
        String::from("RSS idle"),
        &r.rss_idle,
        30.0,
        problem("rss"),
    ));
    main.push(mib_row(
        format!("RSS with {} open SSE streams", n(plan.sse_streams as f64)),
        &r.rss_streams,
        300.0,
        problem("rss"),
    ));
    let health64 = r.health.get(&64).map_or(&empty, |level| &level.0);
    main.push(percent_row(
        String::from("durable submits/s vs the same server's GET /v1/health rate, 64 connections"),
        at64,
        "/s",
        health64.median(),
        format!("GET /v1/health at 64 clients: {}/s", n(health64.median())),
        Some(50.0),
        problem("submit"),
    ));
    main.push(at_most_row(
        String::from("service context switches per submit, 64 clients (/proc, all threads)"),
        r.proc.submit_switches.get(&64).unwrap_or(&empty),
        "",
        2,
        1.0,
        problem("submit"),
    ));
    main.push(threads_row(r, problem("submit")));
    let pg = &r.pg;
    let pg_ceiling = pg.ceiling_tps.median();
    main.push(percent_row(
        format!(
            "durable background submits (202) per second on PostgreSQL, one instance, {} clients",
            plan.pg_clients
        ),
        &pg.one.0,
        "/s",
        pg_ceiling,
        format!(
            "pgbench single-row insert commits/s, {} clients: {}",
            plan.pg_clients,
            n(pg_ceiling)
        ),
        Some(50.0),
        problem("postgres"),
    ));
    main.push(percent_row(
        format!(
            "durable background submits (202) per second on PostgreSQL, {} instances on one database (summed), {} clients",
            plan.pg_instances, plan.pg_clients
        ),
        &pg.three.0,
        "/s",
        pg.one.0.median(),
        format!("one instance: {}/s", n(pg.one.0.median())),
        Some(90.0),
        problem("postgres"),
    ));
    let pgbench_p99 = pg.pgbench_paced_p99.median();
    main.push(times_row(
        format!(
            "p99 submit latency on PostgreSQL at half the peak rate (≈ {}/s), one instance",
            n(pg.half_peak_rate.median())
        ),
        &pg.half_peak_p99,
        "ms",
        pgbench_p99,
        format!(
            "pgbench's p99 paced at the same rate ({} clients, -R): {} ms",
            plan.pg_clients,
            fmt_num(pgbench_p99, 2)
        ),
        Some(3.0),
        problem("postgres"),
    ));
    let sqlite_events = pg.sqlite_events_per_s.median();
    main.push(percent_row(
        format!(
            "persisted events per second on PostgreSQL, {} tasks × {} tokens streaming, one instance",
            plan.stream_tasks, plan.pg_stream_tokens
        ),
        &pg.events_per_s,
        "/s",
        sqlite_events,
        format!(
            "SQLite on the same workload, same run: {}/s",
            n(sqlite_events)
        ),
        Some(50.0),
        problem("postgres"),
    ));
    main
}

/// Every other figure: each concurrency's submits and health checks, `/proc`, event delays,
/// startup, the peer.
fn other_rows(plan: &Plan, r: &Results, medians: &Medians) -> Vec<Row> {
    let Medians {
        rows_per_s: rows_ceiling,
        commit_ms,
        single_commits_per_s: single,
        ..
    } = *medians;
    let problem = |name: &str| r.problems.get(name);

    let mut other = Vec::new();
    for (&clients, (per_s, p50, p99, errors)) in &r.submit {
        let (ceiling, text) = if clients == 1 {
            (
                single,
                format!("raw fsync'd single-row commits/s: {}", n(single)),
            )
        } else {
            (
                rows_ceiling,
                format!("raw rows/s at {PER_COMMIT} per commit"),
            )
        };
        let label = if clients == 1 { "client" } else { "clients" };
        let errors = if *errors > 0 {
            format!(" ({errors} errors)")
        } else {
            String::new()
        };
        other.push(percent_row(
            format!("submits per second, {clients} {label}{errors}"),
            per_s,
            "/s",
            ceiling,
            text,
            None,
            None,
        ));
        other.extend(latency_rows(
            "submit latency",
            &format!("{clients} {label}"),
            [p50, p99],
            commit_ms,
        ));
    }
    for (&clients, (per_s, p50, p99, _)) in &r.health {
        let label = if clients == 1 { "client" } else { "clients" };
        other.push(percent_row(
            format!(
                "HTTP floor: GET /v1/health (no auth, no SQLite) per second, {clients} {label}"
            ),
            per_s,
            "/s",
            rows_ceiling,
            format!("raw rows/s at {PER_COMMIT} per commit"),
            None,
            None,
        ));
        other.extend(latency_rows(
            "HTTP floor: GET /v1/health latency",
            &format!("{clients} {label}"),
            [p50, p99],
            commit_ms,
        ));
    }
    other.extend(per_clients(
        &r.proc.submit_switches,
        2,
        problem("submit"),
        |clients| format!("service context switches per submit, {clients}"),
    ));
    other.extend(per_clients(
        &r.proc.health_switches,
        2,
        problem("submit"),
        |clients| format!("service context switches per GET /v1/health, {clients}"),
    ));
    other.push(plain_row_digits(
        String::from("service threads idle (0.2 s after ready)"),
        &[&r.proc.threads_idle],
        "",
        0,
        problem("submit"),
    ));
    other.extend(per_clients(
        &r.proc.submit_threads,
        0,
        problem("submit"),
        |clients| format!("service threads, most seen while submitting, {clients}"),
    ));
    other.push(plain_row(
        String::from("event created_at → SSE arrival, p50 / p99 (1 ms resolution)"),
        &[&r.events_delay_p50, &r.events_delay_p99],
        "ms",
        problem("events"),
    ));
    other.push(plain_row(
        String::from("startup on an empty data directory (spawn → listening)"),
        &[&r.fresh_start_s],
        "ms",
        problem("rss"),
    ));
    let apalis = r.peer_apalis.median();
    other.push(percent_row(
        format!(
            "peer: LMSP jobs/s, submit-and-complete ({} jobs, {} workers)",
            n(plan.peer_jobs as f64),
            plan.peer_workers
        ),
        &r.peer_lmsp,
        "/s",
        apalis,
        format!("apalis 0.6 + SQLite jobs/s: {}", r.peer_apalis.format(0)),
        None,
        problem("peer"),
    ));
    other
}

/// The p50 and p99 rows of `what` at `clients`, beside one raw commit.
fn latency_rows(what: &str, clients: &str, [p50, p99]: [&Spread; 2], commit_ms: f64) -> [Row; 2] {
    [("p50", p50), ("p99", p99)].map(|(quantile, spread)| {
        times_row(
            format!("{what} {quantile}, {clients}"),
            spread,
            "ms",
            commit_ms,
            String::from("one raw fsync'd commit (median)"),
            None,
            None,
        )
    })
}

/// A plain row per concurrency of `by_clients`, named by `figure` from "N client(s)".
fn per_clients(
    by_clients: &BTreeMap<usize, Spread>,
    digits: usize,
    problem: Option<&String>,
    figure: impl Fn(&str) -> String,
) -> Vec<Row> {
    by_clients
        .iter()
        .map(|(&clients, spread)| {
            let label = if clients == 1 { "client" } else { "clients" };
            let name = figure(&format!("{clients} {label}"));
            plain_row_digits(name, &[spread], "", digits, problem)
        })
        .collect()
}

/// The raw ceilings and what did not run, under the tables.
fn footnotes(plan: &Plan, r: &Results) {
    let c = &r.ceilings;
    let pg = &r.pg;
    println!(
        "\nraw ceilings (min / median / max): fsync'd single-row commits/s {}; one commit {} ms; rows/s at {PER_COMMIT} per commit {}; event appends/s at {PER_COMMIT} per commit {}; update + insert {} rows {} s",
        c.single_commits_per_s.format(0),
        c.commit_ms.format(2),
        c.rows_per_s.format(0),
        c.events_per_s.format(0),
        n(c.leftovers as f64),
        c.update_insert_s.format(2)
    );
    if !pg.ceiling_tps.is_empty() {
        println!(
            "PostgreSQL ceiling (min / median / max): pgbench single-row insert commits/s at {} clients {}; on {}",
            plan.pg_clients,
            pg.ceiling_tps.format(0),
            pg.described
        );
    }
    if !r.purge_seconds.is_empty() {
        println!(
            "purge of {} events took {} s",
            n(r.purged_events as f64),
            r.purge_seconds.format(2)
        );
    }
    for (name, problem) in &r.problems {
        println!("{name}: {problem}");
    }
}

/// The PostgreSQL figures beside pgbench's ceiling and the SQLite figures of the same run.
fn postgres_table(plan: &Plan, r: &Results) {
    let pg = &r.pg;
    let problem = r.problems.get("postgres");
    let empty = Spread::new();
    let ceiling = pg.ceiling_tps.median();
    let ceiling_text = || String::from("pgbench single-row insert commits/s");
    let sqlite64 = r
        .submit
        .get(&plan.pg_clients)
        .map_or(&empty, |level| &level.0);
    let clients = plan.pg_clients;
    let mut rows = Vec::new();
    for (label, level) in [
        (String::from("one instance"), &pg.one),
        (
            format!("{} instances (summed)", plan.pg_instances),
            &pg.three,
        ),
    ] {
        let errors = if level.3 > 0 {
            format!(" ({} errors)", level.3)
        } else {
            String::new()
        };
        rows.push(percent_row(
            format!("PostgreSQL: submits per second, {label}, {clients} clients{errors}"),
            &level.0,
            "/s",
            ceiling,
            ceiling_text(),
            None,
            problem,
        ));
        rows.push(plain_row_digits(
            format!("PostgreSQL: submit latency p50 / p99, {label}, {clients} clients"),
            &[&level.1, &level.2],
            "ms",
            2,
            problem,
        ));
    }
    rows.push(percent_row(
        format!("PostgreSQL: submits per second, one instance, {clients} clients, vs SQLite"),
        &pg.one.0,
        "/s",
        sqlite64.median(),
        format!(
            "SQLite submits/s, {clients} clients, same run: {}",
            n(sqlite64.median())
        ),
        None,
        problem,
    ));
    rows.push(percent_row(
        format!(
            "PostgreSQL: persisted events per second, {} tasks × {} tokens streaming, one instance",
            plan.stream_tasks, plan.pg_stream_tokens
        ),
        &pg.events_per_s,
        "/s",
        ceiling,
        ceiling_text(),
        None,
        problem,
    ));
    rows.push(percent_row(
        format!(
            "PostgreSQL: persisted events per second, {} tasks × {} tokens streaming, vs SQLite (same workload)",
            plan.stream_tasks, plan.pg_stream_tokens
        ),
        &pg.events_per_s,
        "/s",
        pg.sqlite_events_per_s.median(),
        format!(
            "SQLite events/s, same run: {}",
            n(pg.sqlite_events_per_s.median())
        ),
        None,
        problem,
    ));
    let errors = if pg.half_peak_errors > 0 {
        format!(" ({} errors)", pg.half_peak_errors)
    } else {
        String::new()
    };
    rows.push(plain_row_digits(
        format!(
            "PostgreSQL: submit latency p99 paced at half the peak (≈ {}/s), one instance{errors}",
            n(pg.half_peak_rate.median())
        ),
        &[&pg.half_peak_p99],
        "ms",
        2,
        problem,
    ));
    rows.push(plain_row_digits(
        format!(
            "pgbench: single-row insert p99 paced at the same rate ({clients} clients, -R; start → end)"
        ),
        &[&pg.pgbench_paced_p99],
        "ms",
        2,
        problem,
    ));
    rows.push(plain_row(
        format!(
            "PostgreSQL: persisted events per second, {} streams over {} instances (each stream on another instance than its task's POST), {} tokens",
            plan.pg_streams, plan.pg_instances, plan.pg_stream_tokens
        ),
        &[&pg.streams_per_s],
        "/s",
        problem,
    ));
    rows.push(plain_row(
        format!(
            "PostgreSQL: event created_at → SSE arrival, p50 / p99, {} streams over {} instances",
            plan.pg_streams, plan.pg_instances
        ),
        &[&pg.streams_delay_p50, &pg.streams_delay_p99],
        "ms",
        problem,
    ));
    rows.push(plain_row(
        format!(
            "PostgreSQL: claims per second, {} queued, one instance, {} claim loops",
            plan.pg_claim_queue, plan.pg_claimers
        ),
        &[&pg.claims_one],
        "/s",
        problem,
    ));
    rows.push(percent_row(
        format!(
            "PostgreSQL: claims per second, {} queued, {} instances (summed) vs one",
            plan.pg_claim_queue, plan.pg_instances
        ),
        &pg.claims_three,
        "/s",
        pg.claims_one.median(),
        format!("one instance: {}/s", n(pg.claims_one.median())),
        Some(90.0),
        problem,
    ));
    rows.push(plain_row(
        String::from("PostgreSQL: event created_at → SSE arrival, p50 / p99 (1 ms resolution)"),
        &[&pg.events_delay_p50, &pg.events_delay_p99],
        "ms",
        problem,
    ));
    print_table(
        &format!(
            "## PostgreSQL figures (lmsp serve --database URL --instance NAME {} --lease 10s; a fresh database per repetition)",
            submit::SERVE_FLAGS.join(" ")
        ),
        &rows,
    );
}
