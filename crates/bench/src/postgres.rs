//! The PostgreSQL the figures of `--only postgres` run on: a throwaway PostgreSQL 15 cluster the
//! harness starts itself (`initdb` into a temp dir, `pg_ctl start` on a free 127.0.0.1 port, as
//! the `postgres` OS user when the harness runs as root; `fsync` and `synchronous_commit` on, as
//! in production), or the server of `--postgres-url`. Each repetition gets fresh databases
//! (`CREATE DATABASE`), dropped afterwards, so rows never pile up between repetitions.
//!
//! The ceiling is the cluster's own insert-commit rate, measured with `pgbench` in the same run:
//! 64 clients (`-c 64 -j 2`), a custom script of one single-row `INSERT` per transaction into a
//! small table (`lmsp_bench::ceilings::PG_INSERT_SCRIPT`), for a few seconds (`-T`), `-n`.
//!
//! A cluster the harness started is stopped and removed when its [`Postgres`] is dropped, also on
//! an error or a panic.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{anyhow, bail, Context};
use lmsp_bench::ceilings;
use lmsp_bench::stats::Latencies;
use tempfile::TempDir;

/// Where PostgreSQL 15's binaries are by default (Debian and Ubuntu's packages; CI has them).
pub const DEFAULT_BIN: &str = "/usr/lib/postgresql/15/bin";

/// The OS user a cluster runs as when the harness runs as root (`initdb` refuses root).
const OS_USER: &str = "postgres";

/// The settings the harness's own cluster runs with beyond the defaults: durable commits, stated
/// explicitly, and room for three instances' pools plus pgbench's 64 clients.
const SERVER_SETTINGS: &str =
    "-c fsync=on -c synchronous_commit=on -c full_page_writes=on -c max_connections=300";

/// Why no PostgreSQL can be used (`None`: one can): the binaries and, as root, the OS user.
pub fn unavailable(bin: &Path, url: Option<&str>) -> Option<String> {
    if find_pgbench(bin).is_none() {
        return Some(format!(
            "no pgbench in {} or on PATH (install PostgreSQL 15, or pass --postgres-bin DIR)",
            bin.display()
        ));
    }
    if url.is_some() {
        return None;
    }
    for tool in ["initdb", "pg_ctl", "postgres"] {
        if !bin.join(tool).exists() {
            return Some(format!(
                "no {} (PostgreSQL 15's server binaries: install them, or pass --postgres-bin DIR \
                 or --postgres-url URL)",
                bin.join(tool).display()
            ));
        }
    }
    if running_as_root() && os_user_ids(OS_USER).is_none() {
        return Some(format!(
            "running as root, and there is no `{OS_USER}` OS user to run the cluster as \
             (initdb refuses root)"
        ));
    }
    None
}

/// `pgbench` in `bin`, else on `PATH`.
fn find_pgbench(bin: &Path) -> Option<PathBuf> {
    let beside = bin.join("pgbench");
    if beside.exists() {
        return Some(beside);
    }
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("pgbench"))
            .find(|candidate| candidate.exists())
    })
}

/// Whether this process's effective user is root (`Uid:` of `/proc/self/status`).
fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|id| id == "0"))
        })
        .unwrap_or(false)
}

/// The uid and gid of an OS user (`/etc/passwd`).
fn os_user_ids(user: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        if fields.first() != Some(&user) {
            return None;
        }
        Some((fields.get(2)?.parse().ok()?, fields.get(3)?.parse().ok()?))
    })
}

/// `runuser`, where root finds it.
fn runuser() -> PathBuf {
    ["/usr/sbin/runuser", "/sbin/runuser", "/usr/bin/runuser"]
        .iter()
        .map(PathBuf::from)
        .find(|path| path.exists())
        .unwrap_or_else(|| PathBuf::from("runuser"))
}

/// A free TCP port on 127.0.0.1 (bound, read, released: a small race that a start would report).
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// `url` with its database replaced by `database` (its user, host, port and query kept).
pub fn with_database(url: &str, database: &str) -> anyhow::Result<String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| anyhow!("not a postgres:// URL: {url}"))?;
    let (before_query, query) = match rest.split_once('?') {
        Some((before, query)) => (before, Some(query)),
        None => (rest, None),
    };
    let authority = before_query
        .split_once('/')
        .map_or(before_query, |(authority, _)| authority);
    Ok(match query {
        Some(query) => format!("{scheme}://{authority}/{database}?{query}"),
        None => format!("{scheme}://{authority}/{database}"),
    })
}

/// `url` without its password, for messages.
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((user_info, host)) if user_info.contains(':') => {
            let user = user_info.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:…@{host}")
        }
        _ => url.to_owned(),
    }
}

/// A cluster the harness started: stopped and removed on drop.
#[derive(Debug)]
struct Cluster {
    dir: TempDir,
    data: PathBuf,
    bin: PathBuf,
    as_user: Option<&'static str>,
}

impl Cluster {
    /// `program` of the cluster's binaries, run as the cluster's OS user, in its directory.
    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        let mut command = match self.as_user {
            Some(user) => {
                let mut command = Command::new(runuser());
                command.args(["-u", user, "--"]).arg(path);
                command
            }
            None => Command::new(path),
        };
        command.current_dir(self.dir.path()).stdin(Stdio::null());
        command
    }

    /// Runs `command` to its end; its stderr (and the server log's tail) make the error.
    fn run(&self, mut command: Command, what: &str) -> anyhow::Result<()> {
        let err_path = self.dir.path().join(format!("{what}.err"));
        let err = File::create(&err_path)?;
        let status = command
            .stdout(Stdio::null())
            .stderr(err)
            .status()
            .with_context(|| format!("cannot run {what} ({command:?})"))?;
        if !status.success() {
            let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
            let log =
                std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            bail!(
                "{what} failed ({status}): {} {}",
                stderr.trim(),
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            );
        }
        Ok(())
    }

    fn stop(&mut self) {
        if self.data.join("postmaster.pid").exists() {
            let mut command = self.command("pg_ctl");
            command.arg("stop").arg("-D").arg(&self.data).args([
                "-m",
                "immediate",
                "-w",
                "-t",
                "60",
            ]);
            if let Err(error) = self.run(command, "pg_ctl-stop") {
                eprintln!("  postgres: {error:#}");
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
        // The TempDir (owned by root or by this user) is removed after this.
    }
}

/// The PostgreSQL server the figures run on.
#[derive(Debug)]
pub struct Postgres {
    cluster: Option<Cluster>,
    /// A URL of a database that exists (for `CREATE DATABASE` and `DROP DATABASE`).
    admin_url: String,
    pgbench: PathBuf,
    /// What it is, for the output.
    pub description: String,
}

impl Postgres {
    /// Starts a throwaway cluster from the binaries in `bin`.
    pub fn start_cluster(bin: &Path) -> anyhow::Result<Self> {
        let pgbench = find_pgbench(bin).ok_or_else(|| anyhow!("no pgbench"))?;
        let as_user = running_as_root().then_some(OS_USER);
        // Not under the harness's work directory: that one is private to this user (0700), and
        // the cluster's user must reach its own directory.
        let dir = tempfile::Builder::new()
            .prefix("lmsp-bench-pg-")
            .tempdir_in(std::env::temp_dir())
            .context("cannot create the cluster's directory")?;
        if let Some(user) = as_user {
            let (uid, gid) = os_user_ids(user).ok_or_else(|| anyhow!("no {user} OS user"))?;
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .with_context(|| format!("cannot chown {} to {user}", dir.path().display()))?;
        }
        let data = dir.path().join("data");
        let cluster = Cluster {
            data: data.clone(),
            dir,
            bin: bin.to_path_buf(),
            as_user,
        };
        let mut initdb = cluster.command("initdb");
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8"])
            // Skips only initdb's own final sync of the new files; the server's fsync stays on.
            .args(["--no-sync", "--no-instructions"]);
        cluster.run(initdb, "initdb")?;
        let port = free_port()?;
        let options = format!(
            "-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={} {SERVER_SETTINGS}",
            cluster.dir.path().display()
        );
        let mut start = cluster.command("pg_ctl");
        start
            .arg("start")
            .args(["-w", "-t", "120", "-D"])
            .arg(&data)
            .arg("-l")
            .arg(cluster.dir.path().join("postgres.log"))
            .arg("-o")
            .arg(&options);
        cluster.run(start, "pg_ctl-start")?;
        let version = Command::new(bin.join("postgres"))
            .arg("--version")
            .output()
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
            .unwrap_or_default();
        Ok(Self {
            description: format!(
                "a throwaway cluster started by the harness ({version}, initdb in {}, 127.0.0.1:{port}{}; {SERVER_SETTINGS}, other settings default)",
                cluster.dir.path().display(),
                as_user.map_or(String::new(), |user| format!(", run as the {user} OS user")),
            ),
            admin_url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            cluster: Some(cluster),
            pgbench,
        })
    }

    /// The server of `url` (its database must exist; the harness creates and drops its own
    /// databases beside it).
    pub fn external(url: &str, bin: &Path) -> anyhow::Result<Self> {
        let pgbench = find_pgbench(bin).ok_or_else(|| anyhow!("no pgbench"))?;
        Ok(Self {
            cluster: None,
            admin_url: url.to_owned(),
            pgbench,
            description: format!("the server of --postgres-url {}", redacted(url)),
        })
    }

    /// Whether the harness started this server (and will remove it).
    pub fn is_owned(&self) -> bool {
        self.cluster.is_some()
    }

    async fn execute(&self, url: &str, sql: &str) -> anyhow::Result<()> {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .with_context(|| format!("cannot connect to {}", redacted(url)))?;
        let driver = tokio::spawn(connection);
        let outcome = client.batch_execute(sql).await;
        drop(client);
        let _ = driver.await;
        outcome.with_context(|| format!("{sql} on {}", redacted(url)))
    }

    /// Creates a fresh database and returns its URL.
    pub async fn create_database(&self, name: &str) -> anyhow::Result<String> {
        self.execute(&self.admin_url, &ceilings::pg_create_database(name))
            .await?;
        with_database(&self.admin_url, name)
    }

    /// Drops a database made by [`Postgres::create_database`] (its connections are closed).
    pub async fn drop_database(&self, name: &str) -> anyhow::Result<()> {
        self.execute(&self.admin_url, &ceilings::pg_drop_database(name))
            .await
    }

    /// Runs `run` on a fresh database named after `what`, then drops the database whatever
    /// `run` gave; `run`'s outcome.
    pub async fn in_fresh_database<T, F, Fut>(&self, what: &str, run: F) -> anyhow::Result<T>
    where
        F: FnOnce(String) -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<T>>,
    {
        let name = database_name(what);
        let url = self.create_database(&name).await?;
        let outcome = run(url).await;
        self.drop_database(&name).await?;
        outcome
    }

    /// The insert-commit ceiling: `pgbench -n -c CLIENTS -j THREADS -T SECONDS -f script` on a
    /// fresh database; returns its tps without the initial connection time.
    pub async fn pgbench(
        &self,
        work_dir: &Path,
        clients: usize,
        threads: usize,
        seconds: u64,
    ) -> anyhow::Result<f64> {
        let (stdout, _) = self
            .run_pgbench(work_dir, clients, threads, seconds, None)
            .await?;
        parse_tps(&stdout).ok_or_else(|| {
            anyhow!(
                "no \"tps = … (without initial connection time)\" in pgbench's output: {stdout}"
            )
        })
    }

    /// The same script paced at `rate` transactions per second (`-R`, with per-transaction logs,
    /// `-l`): the p99 of each transaction from its start to its end (the schedule lag left out,
    /// as the service's paced submits are timed from their send), in ms, and the rate achieved.
    pub async fn pgbench_paced(
        &self,
        work_dir: &Path,
        clients: usize,
        threads: usize,
        seconds: u64,
        rate: f64,
    ) -> anyhow::Result<PacedPgbench> {
        let (stdout, mut latencies) = self
            .run_pgbench(work_dir, clients, threads, seconds, Some(rate))
            .await?;
        if latencies.is_empty() {
            bail!("pgbench -R logged no transaction: {stdout}");
        }
        Ok(PacedPgbench {
            per_s: parse_tps(&stdout).unwrap_or_default(),
            p50_ms: latencies.quantile_ms(0.5),
            p99_ms: latencies.quantile_ms(0.99),
        })
    }

    /// Runs pgbench's insert script on a fresh database (dropped after); its stdout, and with
    /// `rate` each transaction's latency from its logs (start → end).
    async fn run_pgbench(
        &self,
        work_dir: &Path,
        clients: usize,
        threads: usize,
        seconds: u64,
        rate: Option<f64>,
    ) -> anyhow::Result<(String, Latencies)> {
        let name = database_name("ceiling");
        let url = self.create_database(&name).await?;
        let logs = work_dir.join(format!("pgbench-logs-{name}"));
        let outcome = async {
            self.execute(&url, ceilings::PG_INSERT_TABLE).await?;
            let script = work_dir.join("pgbench-insert.sql");
            std::fs::write(&script, ceilings::PG_INSERT_SCRIPT)?;
            let mut command = tokio::process::Command::new(&self.pgbench);
            command
                .arg("-n")
                .args(["-c", &clients.to_string(), "-j", &threads.to_string()])
                .args(["-T", &seconds.max(1).to_string()]);
            if let Some(rate) = rate {
                std::fs::create_dir_all(&logs)?;
                command
                    .args(["-R", &format!("{:.0}", rate.max(1.0))])
                    .arg("-l")
                    .arg(format!("--log-prefix={}", logs.join("tx").display()));
            }
            let output = command
                .arg("-f")
                .arg(&script)
                .arg(&url)
                .stdin(Stdio::null())
                .output()
                .await
                .with_context(|| format!("cannot run {}", self.pgbench.display()))?;
            let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
            if !output.status.success() {
                bail!(
                    "pgbench failed ({}): {} {}",
                    output.status,
                    stdout.trim(),
                    String::from_utf8_lossy(&output.stderr).trim()
                );
            }
            let mut latencies = Latencies::new();
            if rate.is_some() {
                for entry in std::fs::read_dir(&logs)? {
                    let text = std::fs::read_to_string(entry?.path())?;
                    for line in text.lines() {
                        if let Some(micros) = started_to_end_micros(line) {
                            latencies.push_millis(micros / 1000.0);
                        }
                    }
                }
            }
            Ok((stdout, latencies))
        }
        .await;
        let _ = std::fs::remove_dir_all(&logs);
        let dropped = self.drop_database(&name).await;
        let outcome = outcome?;
        dropped?;
        Ok(outcome)
    }
}

/// What pgbench paced at a fixed rate measured.
#[derive(Debug, Clone, Copy)]
pub struct PacedPgbench {
    /// Transactions per second achieved.
    pub per_s: f64,
    /// p50 start → end, ms.
    pub p50_ms: f64,
    /// p99 start → end, ms.
    pub p99_ms: f64,
}

/// One line of pgbench's per-transaction log under `-R` (`client_id transaction_no time
/// script_no time_epoch time_us schedule_lag`): `time` runs from the scheduled start, so the
/// transaction's own time is `time − schedule_lag`, in µs. `None` for a skipped or unreadable
/// line.
fn started_to_end_micros(line: &str) -> Option<f64> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let time: f64 = fields.get(2)?.parse().ok()?;
    let lag: f64 = fields
        .get(6)
        .and_then(|lag| lag.parse().ok())
        .unwrap_or(0.0);
    Some((time - lag).max(0.0))
}

/// A fresh database name: this process's id and a counter (never a name someone else made).
pub fn database_name(what: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "lmsp_bench_{}_{}_{what}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// pgbench's "tps = N (without initial connection time)".
fn parse_tps(output: &str) -> Option<f64> {
    output.lines().find_map(|line| {
        let rest = line.trim().strip_prefix("tps = ")?;
        if !rest.contains("without initial connection time") {
            return None;
        }
        rest.split_whitespace().next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn urls_and_pgbench_output_parse() {
        assert_eq!(
            with_database("postgres://u:p@h:5432/db?sslmode=disable", "x").unwrap(),
            "postgres://u:p@h:5432/x?sslmode=disable"
        );
        assert_eq!(
            with_database("postgresql://h", "x").unwrap(),
            "postgresql://h/x"
        );
        assert!(with_database("h:5432", "x").is_err());
        assert_eq!(redacted("postgres://u:secret@h/db"), "postgres://u:…@h/db");
        assert_eq!(redacted("postgres://u@h/db"), "postgres://u@h/db");
        let out = "number of transactions actually processed: 1000\n\
                   latency average = 1.234 ms\n\
                   initial connection time = 12.5 ms\n\
                   tps = 4361.123456 (without initial connection time)\n";
        assert_eq!(parse_tps(out), Some(4361.123456));
        assert_eq!(
            parse_tps("tps = 12 (including connections establishing)"),
            None
        );
        assert!(database_name("one").starts_with("lmsp_bench_"));
        assert_eq!(
            started_to_end_micros("3 17 2500 0 1700000000 123 400"),
            Some(2100.0)
        );
        assert_eq!(
            started_to_end_micros("3 17 2500 0 1700000000 123"),
            Some(2500.0)
        );
        assert_eq!(
            started_to_end_micros("3 17 skipped 0 1700000000 123 9"),
            None
        );
    }
}
