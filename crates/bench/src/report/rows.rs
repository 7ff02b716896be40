//! The rows of the tables: a figure, what was measured (min / median / max), its ceiling, the
//! ratio between them, the target and whether the median meets it; one builder per kind of
//! figure.

use crate::results::Results;
use crate::stats::{fmt_num, Spread};

/// One row of a table.
#[derive(Debug)]
pub(super) struct Row {
    pub(super) figure: String,
    pub(super) measured: String,
    pub(super) ceiling: String,
    pub(super) ratio: String,
    pub(super) target: String,
    pub(super) met: String,
}

/// Prints `rows` as a Markdown table under `title`.
pub(super) fn print_table(title: &str, rows: &[Row]) {
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

/// "yes", or a bold "no".
pub(super) fn yes_no(ok: bool) -> String {
    String::from(if ok { "yes" } else { "**no**" })
}

/// measured / ceiling as a percentage row (`at_least` percent targeted).
pub(super) fn percent_row(
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
pub(super) fn times_row(
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

/// A row for a figure that was not measured (why, when known).
pub(super) fn missing(
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

/// A memory figure in MiB with an upper bound as its target.
pub(super) fn mib_row(
    figure: String,
    measured: &Spread,
    at_most: f64,
    problem: Option<&String>,
) -> Row {
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
pub(super) fn at_most_row(
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
pub(super) fn threads_row(r: &Results, problem: Option<&String>) -> Row {
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
pub(super) fn plain_row(
    figure: String,
    spreads: &[&Spread],
    unit: &str,
    problem: Option<&String>,
) -> Row {
    plain_row_digits(figure, spreads, unit, 1, problem)
}

/// [`plain_row`] with `digits` decimals.
pub(super) fn plain_row_digits(
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

/// A whole number with thousands separated.
pub(super) fn n(value: f64) -> String {
    fmt_num(value, 0)
}
