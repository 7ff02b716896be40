//! What `/proc` says about the service during a run: context switches (voluntary + involuntary,
//! summed over its threads) and its thread count.
//!
//! A context switch counter lives in each thread (`/proc/PID/task/TID/status`), and a thread that
//! exits takes its counts with it. So a [`ProcWatch`] reads every thread's counters before the
//! run, then every [`SAMPLE_EVERY`] during it (keeping each thread's last reading, so a thread
//! that exits mid-run still counts up to its last sample, and one born mid-run counts from zero)
//! and once more at the end; the run's switches are the sum over threads of last − first. The
//! same samples give the most threads seen at once (`Threads:` of `/proc/PID/status`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;

use crate::server::Server;

/// How often a watch samples the threads during a run.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(50);

/// `Threads:` of `/proc/{pid}/status`.
pub fn threads(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status_field(&status, "Threads:")
}

fn status_field(status: &str, name: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix(name))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|number| number.parse().ok())
}

/// Each live thread's voluntary + involuntary context switches, by thread id.
fn switches_by_thread(pid: u32) -> BTreeMap<u32, u64> {
    let mut counts = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return counts;
    };
    for task in tasks.flatten() {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // A thread may exit between the listing and the read: it is simply not counted now.
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        let voluntary = status_field(&status, "voluntary_ctxt_switches:");
        let involuntary = status_field(&status, "nonvoluntary_ctxt_switches:");
        if let (Some(voluntary), Some(involuntary)) = (voluntary, involuntary) {
            counts.insert(tid, voluntary + involuntary);
        }
    }
    counts
}

/// What a watch saw over one run.
#[derive(Debug, Clone, Copy)]
pub struct ProcRun {
    /// Context switches of the service's threads during the run.
    pub switches: u64,
    /// The most threads seen at once during the run.
    pub max_threads: u64,
    /// Threads right after the run.
    pub threads_after: u64,
}

/// Each thread's switches before the run, each thread's last reading, the most threads seen.
type Samples = (BTreeMap<u32, u64>, BTreeMap<u32, u64>, u64);

/// Watches the service's threads from [`ProcWatch::start`] to [`ProcWatch::finish`].
#[derive(Debug)]
pub struct ProcWatch {
    stop: Arc<AtomicBool>,
    sampler: tokio::task::JoinHandle<Samples>,
    pid: u32,
}

impl ProcWatch {
    /// Starts watching (`None` for a service given by `--url`: no process to read).
    pub fn start(server: &Server) -> Option<Self> {
        let pid = server.pid()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let sampler = tokio::task::spawn_blocking(move || {
            let first = switches_by_thread(pid);
            let mut last = first.clone();
            let mut max_threads = threads(pid).unwrap_or(0);
            loop {
                let done = stopped.load(Ordering::Relaxed);
                last.extend(switches_by_thread(pid));
                max_threads = max_threads.max(threads(pid).unwrap_or(0));
                if done {
                    return (first, last, max_threads);
                }
                std::thread::sleep(SAMPLE_EVERY);
            }
        });
        Some(Self { stop, sampler, pid })
    }

    /// Ends the watch: the run's switches and threads.
    pub async fn finish(self) -> anyhow::Result<ProcRun> {
        self.stop.store(true, Ordering::Relaxed);
        let (first, last, max_threads) = self.sampler.await?;
        let switches = last
            .iter()
            .map(|(tid, &count)| count.saturating_sub(first.get(tid).copied().unwrap_or(0)))
            .sum();
        let threads_after =
            threads(self.pid).ok_or_else(|| anyhow!("cannot read /proc/{}/status", self.pid))?;
        Ok(ProcRun {
            switches,
            max_threads,
            threads_after,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_of_a_status_file_parse() {
        let status = "Name:\tlmsp\nThreads:\t7\nvoluntary_ctxt_switches:\t120\nnonvoluntary_ctxt_switches:\t3\n";
        assert_eq!(status_field(status, "Threads:"), Some(7));
        assert_eq!(status_field(status, "voluntary_ctxt_switches:"), Some(120));
        assert_eq!(status_field(status, "nonvoluntary_ctxt_switches:"), Some(3));
        assert_eq!(status_field(status, "VmRSS:"), None);
        let me = std::process::id();
        assert!(threads(me).is_some_and(|n| n >= 1));
        assert!(!switches_by_thread(me).is_empty());
    }
}
