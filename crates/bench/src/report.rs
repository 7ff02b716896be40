//! What the harness prints: the run's header (machine, binary, sizes), and the final tables —
//! figure | measured (min / median / max) | ceiling | ratio | target | met? — as Markdown, so
//! they can be pasted into the README as printed. A target is judged on the median.

use std::path::Path;

use crate::chart::Point;
use crate::raw::PER_COMMIT;
use crate::stats::{fmt_num, Spread};
use crate::{submit, Plan, Results};

/// The machine: cores, CPU model, memory, kernel.
pub fn machine() -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{}, Linux {}", machine_short(), kernel.trim())
}

/// `/proc/loadavg`'s 1, 5 and 15 minute load averages (other work on the machine skews figures).
pub fn load_average() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let fields: Vec<&str> = text.split_whitespace().take(3).collect();
    if fields.len() == 3 {
        fields.join(" / ")
    } else {
        String::from("unknown")
    }
}

/// The machine: cores, CPU model, memory.
pub fn machine_short() -> String {
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name"))
        .and_then(|rest| rest.split_once(':'))
        .map_or("unknown CPU", |(_, model)| model.trim())
        .to_owned();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_gib = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    format!("{cores} cores ({model}), {mem_gib:.1} GiB RAM")
}

/// The run's header.
pub fn header(plan: &Plan, lmsp: Option<&Path>, url: Option<&str>, fds: u64) {
    println!(
        "# lmsp-bench ({} run)",
        if plan.quick { "--quick smoke" } else { "full" }
    );
    println!("machine: {}", machine());
    println!("load average before the run: {}", load_average());
    match (lmsp, url) {
        (_, Some(url)) => println!("service: {url} (given; recovery and RSS figures skipped)"),
        (Some(path), None) => {
            println!("service: {} serve (started by the harness)", path.display())
        }
        (None, None) => {}
    }
    println!(
        "repetitions: {}; open-file limit raised to {fds}; every figure is min / median / max over the repetitions",
        plan.reps
    );
    if plan.quick {
        println!("QUICK MODE: sizes are reduced; the figures are not comparable with the targets");
    }
}

#[derive(Debug)]
struct Row {
    figure: String,
    measured: String,
    ceiling: String,
    ratio: String,
    target: String,
    met: String,
}

fn print_table(title: &str, rows: &[Row]) {
    println!("\n{title}\n");
    println!("| figure | measured (min / median / max) | ceiling | ratio | target | met? |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for row in rows {
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            row.figure, row.measured, row.ceiling, row.ratio, row.target, row.met
        );
    }
}

fn yes_no(ok: bool) -> String {
    String::from(if ok { "yes" } else { "**no**" })
}

/// measured / ceiling as a percentage row (`at_least` percent targeted).
fn percent_row(
    figure: String,
    measured: &Spread,
    unit: &str,
    ceiling: f64,
    ceiling_text: String,
    at_least: Option<f64>,
    problem: Option<&String>,
) -> Row {
    if measured.is_empty() {
        return missing(
            figure,
            ceiling_text,
            at_least.map(|t| format!("≥ {t:.0} %")),
            problem,
        );
    }
    if !(ceiling.is_finite() && ceiling > 0.0) {
        // The ceiling did not run (another figure family, skipped or failed).
        return Row {
            figure,
            measured: format!("{} {unit}", measured.format(0)),
            ceiling: ceiling_text,
            ratio: String::from("—"),
            target: at_least.map_or(String::from("—"), |t| format!("≥ {t:.0} %")),
            met: String::from("—"),
        };
    }
    let ratio = 100.0 * measured.median() / ceiling;
    Row {
        figure,
        measured: format!("{} {unit}", measured.format(0)),
        ceiling: ceiling_text,
        ratio: format!("{ratio:.1} %"),
        target: at_least.map_or(String::from("—"), |t| format!("≥ {t:.0} %")),
        met: at_least.map_or(String::from("—"), |t| yes_no(ratio >= t)),
    }
}

/// measured / ceiling as a multiple (`at_most` times targeted).
fn times_row(
    figure: String,
    measured: &Spread,
    unit: &str,
    ceiling: f64,
    ceiling_text: String,
    at_most: Option<f64>,
    problem: Option<&String>,
) -> Row {
    if measured.is_empty() {
        return missing(
            figure,
            ceiling_text,
            at_most.map(|t| format!("≤ {t:.0} ×")),
            problem,
        );
    }
    let ratio = measured.median() / ceiling;
    Row {
        figure,
        measured: format!("{} {unit}", measured.format(2)),
        ceiling: ceiling_text,
        ratio: format!("{ratio:.2} ×"),
        target: at_most.map_or(String::from("—"), |t| format!("≤ {t:.0} ×")),
        met: at_most.map_or(String::from("—"), |t| yes_no(ratio <= t)),
    }
}

fn missing(
    figure: String,
    ceiling: String,
    target: Option<String>,
    problem: Option<&String>,
) -> Row {
    Row {
        figure,
        measured: problem.map_or(String::from("not run"), |p| {
            let short: String = p.chars().take(80).collect();
            short.replace('|', "/")
        }),
        ceiling,
        ratio: String::from("—"),
        target: target.unwrap_or_else(|| String::from("—")),
        met: String::from("—"),
    }
}

fn mib_row(figure: String, measured: &Spread, at_most: f64, problem: Option<&String>) -> Row {
    if measured.is_empty() {
        return missing(
            figure,
            String::from("—"),
            Some(format!("≤ {at_most:.0} MiB")),
            problem,
        );
    }
    Row {
        figure,
        measured: format!("{} MiB", measured.format(1)),
        ceiling: String::from("—"),
        ratio: String::from("—"),
        target: format!("≤ {at_most:.0} MiB"),
        met: yes_no(measured.median() <= at_most),
    }
}

/// A figure with an absolute upper bound as its target, and no ceiling.
fn at_most_row(
    figure: String,
    measured: &Spread,
    unit: &str,
    digits: usize,
    at_most: f64,
    problem: Option<&String>,
) -> Row {
    let target = format!("≤ {}", fmt_num(at_most, digits.min(1)));
    if measured.is_empty() {
        return missing(figure, String::from("—"), Some(target), problem);
    }
    Row {
        figure,
        measured: format!("{} {unit}", measured.format(digits)),
        ceiling: String::from("—"),
        ratio: String::from("—"),
        target,
        met: yes_no(measured.median() <= at_most),
    }
}

/// The thread-count target: the most threads seen under load must not grow with the clients
/// (the largest concurrency's median equals, or is below, the smallest's).
fn threads_row(r: &Results, problem: Option<&String>) -> Row {
    let levels = &r.proc.submit_threads;
    let target = String::from("no growth with load (most clients ≤ 1 client)");
    let figure =
        String::from("service threads, most seen during the submit runs, by clients (medians)");
    let (Some((&low, low_spread)), Some((&high, high_spread))) =
        (levels.iter().next(), levels.iter().next_back())
    else {
        return missing(figure, String::from("—"), Some(target), problem);
    };
    let measured: Vec<String> = levels
        .iter()
        .map(|(clients, spread)| format!("{clients}: {}", fmt_num(spread.median(), 0)))
        .collect();
    let growth = high_spread.median() - low_spread.median();
    Row {
        figure,
        measured: measured.join(", "),
        ceiling: format!("idle: {}", fmt_num(r.proc.threads_idle.median(), 0)),
        ratio: format!("{high} vs {low} clients: {growth:+.0}"),
        target,
        met: yes_no(growth <= 0.0),
    }
}

/// A figure with no ceiling and no target (several spreads joined by " ; ").
fn plain_row(figure: String, spreads: &[&Spread], unit: &str, problem: Option<&String>) -> Row {
    plain_row_digits(figure, spreads, unit, 1, problem)
}

/// [`plain_row`] with `digits` decimals.
fn plain_row_digits(
    figure: String,
    spreads: &[&Spread],
    unit: &str,
    digits: usize,
    problem: Option<&String>,
) -> Row {
    if spreads.iter().any(|s| s.is_empty()) {
        return missing(figure, String::from("—"), None, problem);
    }
    let measured: Vec<String> = spreads
        .iter()
        .map(|s| format!("{} {unit}", s.format(digits)))
        .collect();
    Row {
        figure,
        measured: measured.join(" ; "),
        ceiling: String::from("—"),
        ratio: String::from("—"),
        target: String::from("—"),
        met: String::from("—"),
    }
}

fn n(value: f64) -> String {
    fmt_num(value, 0)
}

/// The final tables.
pub fn tables(plan: &Plan, r: &Results) {
    let c = &r.ceilings;
    let rows_ceiling = c.rows_per_s.median();
    let events_ceiling = c.events_per_s.median();
    let commit_ms = c.commit_ms.median();
    let single = c.single_commits_per_s.median();
    let update_s = c.update_insert_s.median();
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
    print_table("## targets", &main);

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
        other.push(times_row(
            format!("submit latency p50, {clients} {label}"),
            p50,
            "ms",
            commit_ms,
            String::from("one raw fsync'd commit (median)"),
            None,
            None,
        ));
        other.push(times_row(
            format!("submit latency p99, {clients} {label}"),
            p99,
            "ms",
            commit_ms,
            String::from("one raw fsync'd commit (median)"),
            None,
            None,
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
        other.push(times_row(
            format!("HTTP floor: GET /v1/health latency p50, {clients} {label}"),
            p50,
            "ms",
            commit_ms,
            String::from("one raw fsync'd commit (median)"),
            None,
            None,
        ));
        other.push(times_row(
            format!("HTTP floor: GET /v1/health latency p99, {clients} {label}"),
            p99,
            "ms",
            commit_ms,
            String::from("one raw fsync'd commit (median)"),
            None,
            None,
        ));
    }
    for (&clients, per) in &r.proc.submit_switches {
        let label = if clients == 1 { "client" } else { "clients" };
        other.push(plain_row_digits(
            format!("service context switches per submit, {clients} {label}"),
            &[per],
            "",
            2,
            problem("submit"),
        ));
    }
    for (&clients, per) in &r.proc.health_switches {
        let label = if clients == 1 { "client" } else { "clients" };
        other.push(plain_row_digits(
            format!("service context switches per GET /v1/health, {clients} {label}"),
            &[per],
            "",
            2,
            problem("submit"),
        ));
    }
    other.push(plain_row_digits(
        String::from("service threads idle (0.2 s after ready)"),
        &[&r.proc.threads_idle],
        "",
        0,
        problem("submit"),
    ));
    for (&clients, threads) in &r.proc.submit_threads {
        let label = if clients == 1 { "client" } else { "clients" };
        other.push(plain_row_digits(
            format!("service threads, most seen while submitting, {clients} {label}"),
            &[threads],
            "",
            0,
            problem("submit"),
        ));
    }
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
    let service = if plan.external {
        String::from("the service given by --url")
    } else {
        format!("lmsp serve {}", submit::SERVE_FLAGS.join(" "))
    };
    print_table(
        &format!("## Other figures (submit service: {service})"),
        &other,
    );
    postgres_table(plan, r);
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
            "PostgreSQL: persisted events per second, {} tasks × {} tokens streaming, vs SQLite ({} tokens)",
            plan.stream_tasks, plan.pg_stream_tokens, plan.stream_tokens
        ),
        &pg.events_per_s,
        "/s",
        r.events_per_s.median(),
        format!("SQLite events/s, same run: {}", n(r.events_per_s.median())),
        None,
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

/// The chart's points, one per concurrency level.
pub fn chart_points(r: &Results) -> Vec<Point> {
    r.submit
        .iter()
        .map(|(&clients, (per_s, _, p99, _))| Point {
            clients,
            per_s: (per_s.min(), per_s.median(), per_s.max()),
            p99_ms: (p99.min(), p99.median(), p99.max()),
        })
        .collect()
}

/// The line under the chart's title.
pub fn chart_note(plan: &Plan) -> String {
    format!(
        "lmsp serve {} (synchronous=FULL); {} repetition(s) of {:.1} s per level; {}",
        submit::SERVE_FLAGS.join(" "),
        plan.reps,
        plan.submit_duration.as_secs_f64(),
        machine_short()
    )
}
