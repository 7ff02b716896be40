//! The Batch API figures' table: the upload and its RSS, validate + create and its RSS, lines per
//! second against the same lines posted one by one, and an interactive client's p99 while the
//! batch runs against the idle service's.

use crate::batch;
use crate::plan::Plan;
use crate::results::Results;
use crate::stats::{fmt_num, Spread};

use super::rows::*;

/// The longest a batch of the plan's size may take from `POST /v1/batches` to `in_progress`
/// ("seconds", not minutes).
const CREATE_AT_MOST_S: f64 = 10.0;
/// The most the service's RSS may grow while a file is uploaded or a batch checked, as a share
/// of the file's size (memory flat in the file's size: a file is streamed, never held).
const RSS_GROWTH_AT_MOST: f64 = 0.25;
/// The batch's lines per second must be at least this multiple of the same lines posted one by
/// one.
const LINES_AT_LEAST: f64 = 1.0;
/// The interactive p99 while a batch runs may be at most this multiple of the idle service's.
const INTERACTIVE_AT_MOST: f64 = 2.0;

/// Prints the batch table.
pub(super) fn batch_table(plan: &Plan, r: &Results) {
    let b = &r.batch;
    let problem = r.problems.get("batch");
    let lines = n(plan.batch_lines as f64);
    let file_mib = batch::file_bytes(plan.batch_lines) as f64 / (1024.0 * 1024.0);
    let mut rows = Vec::new();

    let mut upload = plain_row_digits(
        format!(
            "batch: upload of a {lines}-line file ({file_mib:.1} MiB), multipart POST /v1/files"
        ),
        &[&b.upload_s],
        "s",
        3,
        problem,
    );
    if !b.upload_s.is_empty() {
        upload.ratio = format!("{} MiB/s", fmt_num(file_mib / b.upload_s.median(), 1));
    }
    rows.push(upload);
    rows.push(rss_row(
        String::from("batch: service RSS peak during the upload"),
        &b.upload_rss_peak,
        &b.upload_rss_before,
        &b.upload_rss_growth,
        file_mib,
        problem,
    ));
    let mut create = at_most_row(
        format!("batch: POST /v1/batches → in_progress (validate + create {lines} tasks)"),
        &b.create_s,
        "s",
        3,
        CREATE_AT_MOST_S,
        problem,
    );
    create.target = format!("seconds (≤ {CREATE_AT_MOST_S:.0} s)");
    if !b.create_s.is_empty() {
        create.ratio = format!(
            "{} lines/s",
            fmt_num(plan.batch_lines as f64 / b.create_s.median(), 0)
        );
    }
    rows.push(create);
    rows.push(rss_row(
        String::from("batch: service RSS peak during validate + create"),
        &b.create_rss_peak,
        &b.create_rss_before,
        &b.create_rss_growth,
        file_mib,
        problem,
    ));
    rows.push(ratio_row(
        String::from("batch: lines finished per second, in_progress → completed"),
        &b.lines_per_s,
        "/s",
        0,
        b.background_per_s.median(),
        format!(
            "the same {lines} lines as background submits ({} clients), first POST → all finished: {}/s",
            plan.batch_submit_clients,
            n(b.background_per_s.median())
        ),
        Bound::AtLeast(LINES_AT_LEAST),
        problem,
    ));
    let errors = if b.interactive_errors > 0 {
        format!(" ({} errors)", b.interactive_errors)
    } else {
        String::new()
    };
    rows.push(ratio_row(
        format!(
            "batch: interactive p99 latency while the batch runs (a synchronous request every {} ms){errors}",
            plan.batch_interactive_every.as_millis()
        ),
        &b.busy_p99,
        "ms",
        2,
        b.idle_p99.median(),
        format!(
            "the same client on the idle service: p99 {} ms",
            fmt_num(b.idle_p99.median(), 2)
        ),
        Bound::AtMost(INTERACTIVE_AT_MOST),
        problem,
    ));
    rows.push(plain_row_digits(
        format!(
            "batch: background submits of the same lines ({} clients), first POST → all finished, per second",
            plan.batch_submit_clients
        ),
        &[&b.background_per_s],
        "/s",
        0,
        problem,
    ));
    rows.push(plain_row_digits(
        String::from("batch: lines per second end to end, POST /v1/batches → completed"),
        &[&b.end_to_end_per_s],
        "/s",
        0,
        problem,
    ));
    rows.push(plain_row_digits(
        String::from(
            "batch: every line counted → completed (the upkeep noticing, then writing the output file)",
        ),
        &[&b.finalize_s],
        "s",
        3,
        problem,
    ));
    rows.push(plain_row_digits(
        String::from("batch: interactive latency p50 / p99, idle service"),
        &[&b.idle_p50, &b.idle_p99],
        "ms",
        2,
        problem,
    ));
    rows.push(plain_row_digits(
        String::from("batch: interactive latency p50 / p99, while the batch runs"),
        &[&b.busy_p50, &b.busy_p99],
        "ms",
        2,
        problem,
    ));
    print_table(
        &format!(
            "## Batch figures (lmsp serve {}; a fresh data directory per run)",
            batch::SERVE_FLAGS.join(" ")
        ),
        &rows,
    );
}

/// A peak RSS beside the reading before it, judged on its growth as a share of the file.
fn rss_row(
    figure: String,
    peak: &Spread,
    before: &Spread,
    growth: &Spread,
    file_mib: f64,
    problem: Option<&String>,
) -> Row {
    let target = format!(
        "flat in the file's size: growth ≤ {:.0} % of the file",
        RSS_GROWTH_AT_MOST * 100.0
    );
    if peak.is_empty() {
        return missing(figure, String::from("—"), Some(target), problem);
    }
    let share = growth.median() / file_mib;
    Row {
        figure,
        measured: format!("{} MiB", peak.format(1)),
        ceiling: format!("RSS before: {} MiB", before.format(1)),
        ratio: format!(
            "{:+.1} MiB = {:.0} % of the file",
            growth.median(),
            share * 100.0
        ),
        target,
        met: yes_no(share <= RSS_GROWTH_AT_MOST),
    }
}

/// Which way a [`ratio_row`]'s target goes.
#[derive(Debug, Clone, Copy)]
enum Bound {
    AtLeast(f64),
    AtMost(f64),
}

/// measured / reference as a multiple, with a bound on it.
#[allow(clippy::too_many_arguments)]
fn ratio_row(
    figure: String,
    measured: &Spread,
    unit: &str,
    digits: usize,
    reference: f64,
    reference_text: String,
    bound: Bound,
    problem: Option<&String>,
) -> Row {
    let target = match bound {
        Bound::AtLeast(t) => format!("≥ {t:.0} ×"),
        Bound::AtMost(t) => format!("≤ {t:.0} ×"),
    };
    if measured.is_empty() {
        return missing(figure, reference_text, Some(target), problem);
    }
    if !(reference.is_finite() && reference > 0.0) {
        return Row {
            figure,
            measured: format!("{} {unit}", measured.format(digits)),
            ceiling: reference_text,
            ratio: String::from("—"),
            target,
            met: String::from("—"),
        };
    }
    let ratio = measured.median() / reference;
    Row {
        figure,
        measured: format!("{} {unit}", measured.format(digits)),
        ceiling: reference_text,
        ratio: format!("{ratio:.2} ×"),
        target,
        met: yes_no(match bound {
            Bound::AtLeast(t) => ratio >= t,
            Bound::AtMost(t) => ratio <= t,
        }),
    }
}
