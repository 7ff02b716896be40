//! Logs on stderr, plain or JSON, that can never cost a reply: lines go through a bounded,
//! lossy queue to a writer thread, and a sink that is gone (stderr closed, log disk full) loses
//! lines, counted, instead of blocking or failing the request that logged.
//!
//! Under `--log-format json` every line on stderr is one JSON object of tracing's shape
//! (`timestamp`, `level`, `fields.message`, …, `target`): the log lines, the lines a person must
//! see (the admin token, the address), a panic's report and the error a failed start exits with.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tracing_appender::non_blocking::{NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};

use crate::cli::LogFormat;

/// stderr, with write errors swallowed and counted.
struct QuietStderr {
    failed: Arc<AtomicU64>,
}

impl Write for QuietStderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if io::stderr().write_all(buf).is_err() {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = io::stderr().flush();
        Ok(())
    }
}

/// The installed logger: keep it alive while the process logs; it counts dropped lines.
pub struct Logs {
    _guard: WorkerGuard,
    queue_dropped: tracing_appender::non_blocking::ErrorCounter,
    write_failed: Arc<AtomicU64>,
    format: LogFormat,
}

impl Logs {
    /// How many lines were lost so far (queue full, or the sink failed).
    pub fn dropped(&self) -> impl Fn() -> u64 + Send + Sync + 'static {
        let queue = self.queue_dropped.clone();
        let failed = Arc::clone(&self.write_failed);
        move || queue.dropped_lines() as u64 + failed.load(Ordering::Relaxed)
    }

    /// Prints a line a person must see (the admin token, the address) straight to stderr: as
    /// `text` (whose `{}` is the field's value), or as a JSON object shaped like the log lines;
    /// never dropped, never a failure.
    pub fn announce(&self, text: &str, message: &str, field: (&str, &str)) {
        let line = match self.format {
            LogFormat::Text => format!("{}\n", text.replace("{}", field.1)),
            LogFormat::Json => json_line("INFO", message, &[field]),
        };
        write_stderr(&line);
    }
}

/// One line of JSON shaped like tracing's JSON log lines: `timestamp`, `level`, `fields` (the
/// `message` and `fields`), `target`; ends with a newline.
pub fn json_line(level: &str, message: &str, fields: &[(&str, &str)]) -> String {
    let mut timestamp = String::new();
    let _ = SystemTime.format_time(&mut Writer::new(&mut timestamp));
    let mut values = serde_json::Map::new();
    values.insert("message".into(), message.into());
    for (name, value) in fields {
        values.insert((*name).into(), (*value).into());
    }
    let line = serde_json::json!({
        "timestamp": timestamp,
        "level": level,
        "fields": values,
        "target": "lmsp",
    });
    format!("{line}\n")
}

/// Writes straight to stderr, ignoring a sink that is gone (never a panic, unlike `eprintln!`).
pub fn write_stderr(text: &str) {
    let mut stderr = io::stderr().lock();
    let _ = stderr.write_all(text.as_bytes());
    let _ = stderr.flush();
}

/// Prints the error a command ends with, for the person at the terminal (`error: …`, the cause
/// chain on one line, never a backtrace), or as one JSON line under `--log-format json`.
pub fn print_error(format: LogFormat, error: &anyhow::Error) {
    let text = format!("{error:#}");
    match format {
        LogFormat::Text => write_stderr(&format!("error: {text}\n")),
        LogFormat::Json => write_stderr(&json_line("ERROR", &text, &[])),
    }
}

/// Installs the logger for `format`, filtered by `RUST_LOG` (default `info`).
pub fn install(format: LogFormat) -> Logs {
    let write_failed = Arc::new(AtomicU64::new(0));
    let writer = QuietStderr {
        failed: Arc::clone(&write_failed),
    };
    let (non_blocking, guard) = NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(16 * 1024)
        .thread_name("lmsp-log")
        .finish(writer);
    let queue_dropped = non_blocking.error_counter();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only for a terminal: a log file or a pipe gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(non_blocking);
    match format {
        LogFormat::Json => {
            builder.json().init();
            // A panic's report is a JSON line too (the default hook prints plain text).
            std::panic::set_hook(Box::new(|info| {
                let thread = std::thread::current();
                let name = thread.name().unwrap_or("unnamed");
                write_stderr(&json_line(
                    "ERROR",
                    "a thread panicked",
                    &[("thread", name), ("panic", &info.to_string())],
                ));
            }));
        }
        LogFormat::Text => builder.init(),
    }
    Logs {
        _guard: guard,
        queue_dropped,
        write_failed,
        format,
    }
}
