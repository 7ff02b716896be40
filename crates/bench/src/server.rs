//! The service under test: finds the `lmsp` binary, starts `lmsp serve` on a data directory and
//! port 0, reads the admin token and the address from its stderr, reads its RSS, and kills it.
//! Or, with `--url`, stands for a service someone else runs.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};

/// Finds `lmsp`: `--lmsp-bin`, else `LMSP_BIN`, else next to this executable (same target dir).
pub fn find_lmsp(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = explicit {
        return Ok(path.to_path_buf());
    }
    if let Some(path) = std::env::var_os("LMSP_BIN") {
        return Ok(PathBuf::from(path));
    }
    let beside = sibling_of_exe("lmsp")?;
    if beside.exists() {
        return Ok(beside);
    }
    bail!(
        "cannot find the lmsp binary at {} (build it with `cargo build --release -p lmsp`, \
         or pass --lmsp-bin PATH / set LMSP_BIN)",
        beside.display()
    )
}

/// `name` in this executable's directory.
pub fn sibling_of_exe(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot locate this executable")?;
    let dir = exe
        .parent()
        .ok_or_else(|| anyhow!("this executable has no directory"))?;
    Ok(dir.join(name))
}

/// A running service: one the harness started, or one given by `--url`.
#[derive(Debug)]
pub struct Server {
    child: Option<Child>,
    /// `http://ADDR`.
    pub base: String,
    /// A token with `admin` scope.
    pub token: String,
    /// From spawn to the "listening" line (zero for a given URL).
    pub ready_after: Duration,
}

/// How long a start may take before the harness gives up.
const START_TIMEOUT: Duration = Duration::from_secs(600);

impl Server {
    /// A service someone else runs.
    pub fn external(base: &str, token: &str) -> Self {
        Self {
            child: None,
            base: base.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
            ready_after: Duration::ZERO,
        }
    }

    /// Starts `lmsp serve --data-dir DATA --listen 127.0.0.1:0 EXTRA…` and waits for it to listen.
    /// The admin token is printed only on a data directory's first start; `token` is used when it
    /// is not printed.
    pub fn start(lmsp: &Path, data_dir: &Path, extra: &[&str]) -> anyhow::Result<Self> {
        let spawned_at = Instant::now();
        let mut child = Command::new(lmsp)
            .arg("serve")
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {}", lmsp.display()))?;
        let stderr = child
            .stderr
            .take()
            .ok_or_else(|| anyhow!("no stderr pipe"))?;
        let (sender, lines) = mpsc::channel::<(Instant, String)>();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                // After start-up nobody listens: keep draining so the child never blocks.
                let _ = sender.send((Instant::now(), line));
            }
        });
        let mut server = Self {
            child: Some(child),
            base: String::new(),
            token: String::new(),
            ready_after: Duration::ZERO,
        };
        let deadline = spawned_at + START_TIMEOUT;
        let mut tail = Vec::new();
        loop {
            let wait = deadline.saturating_duration_since(Instant::now());
            let (at, line) = match lines.recv_timeout(wait) {
                Ok(received) => received,
                Err(_) => {
                    bail!(
                        "lmsp serve did not print its address (stderr tail: {})",
                        tail.join(" | ")
                    )
                }
            };
            if let Some(token) = line.strip_prefix("admin token (shown once): ") {
                server.token = token.trim().to_owned();
            } else if let Some(address) = line.strip_prefix("lmsp listening on ") {
                server.base = address.trim().to_owned();
                server.ready_after = at.duration_since(spawned_at);
                break;
            } else {
                tail.push(line);
                if tail.len() > 5 {
                    tail.remove(0);
                }
            }
        }
        // Keep draining stderr in the background.
        std::thread::spawn(move || while lines.recv().is_ok() {});
        Ok(server)
    }

    /// The process id, when the harness started the service.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `VmRSS` of the process in MiB.
    pub fn rss_mib(&self) -> anyhow::Result<f64> {
        let pid = self
            .pid()
            .ok_or_else(|| anyhow!("the RSS of a service given by URL is not readable"))?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("cannot read /proc/{pid}/status"))?;
        let kib: f64 = status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|number| number.parse().ok())
            .ok_or_else(|| anyhow!("no VmRSS in /proc/{pid}/status"))?;
        Ok(kib / 1024.0)
    }

    /// CPU time (user + system) the process has used, in seconds (`None` for a given URL).
    pub fn cpu_seconds(&self) -> Option<f64> {
        self.pid().and_then(|pid| cpu_seconds_of(&pid.to_string()))
    }

    /// A full URL.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// SIGKILLs the process the harness started (nothing for a given URL).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Linux's `USER_HZ`: the unit of the CPU times in `/proc/PID/stat`.
const USER_HZ: f64 = 100.0;

/// CPU time (user + system) of `/proc/{pid}/stat`, in seconds; `pid` may be `self`.
pub fn cpu_seconds_of(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / USER_HZ)
}

/// Cores used by the service and by this harness between two instants.
#[derive(Debug, Clone, Copy)]
pub struct CpuMeter {
    server: Option<f64>,
    harness: Option<f64>,
    at: Instant,
}

impl CpuMeter {
    /// Starts measuring.
    pub fn start(server: &Server) -> Self {
        Self {
            server: server.cpu_seconds(),
            harness: cpu_seconds_of("self"),
            at: Instant::now(),
        }
    }

    /// "server X cores, harness Y cores" since the start.
    pub fn report(&self, server: &Server) -> String {
        let wall = self.at.elapsed().as_secs_f64().max(1e-9);
        let cores = |before: Option<f64>, after: Option<f64>| match (before, after) {
            (Some(before), Some(after)) => format!("{:.2}", (after - before) / wall),
            _ => String::from("?"),
        };
        format!(
            "CPU: service {} cores, harness {} cores",
            cores(self.server, server.cpu_seconds()),
            cores(self.harness, cpu_seconds_of("self"))
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}
