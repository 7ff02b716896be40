//! What the harness prints: the run's header (machine, binary, sizes), and the final tables —
//! figure | measured (min / median / max) | ceiling | ratio | target | met? — as Markdown, so
//! they can be pasted into the README as printed. A target is judged on the median. The rows are
//! built in `rows`, the tables in `tables` (the Batch API's in `batch_table`).

mod batch_table;
mod claims_table;
mod rows;
mod tables;

use std::path::Path;

use crate::chart::Point;
use crate::plan::Plan;
use crate::results::Results;
use crate::submit;

pub use tables::tables;

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
