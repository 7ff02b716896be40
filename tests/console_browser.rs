//! The web console (`/console/`, crates/console) in a real browser: this test starts the real
//! binary with a slow reference engine (so a stream can be watched and a task cancelled) and
//! runs crates/console/e2e/console.test.mjs, which drives Debian's `/usr/bin/chromium` with
//! `playwright-core`: log in, overview (store and engine health), submit and stream, a task's
//! live timeline seen growing, cancel (after a confirmation), a stream resumed after a network
//! drop, models, clients (pairing code, revoke with confirm), keyboard-only navigation with a
//! visible focus, HTML-looking input rendered as text, log out, what a read-only token is shown,
//! and no console error or CSP violation in the whole run.
//!
//! Its tools are installed by `scripts/console-test-deps`; without them this test fails (it
//! never skips). `LMSP_CONSOLE_SCREENSHOTS=DIR` saves a PNG of each view there.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lmsp_tests as common;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::TestServer;

/// The whole browser run may take this long.
const BROWSER_DEADLINE: Duration = Duration::from_secs(300);

fn repository() -> PathBuf {
    common::workspace_root()
}

fn missing(what: &str) -> ! {
    panic!(
        "{what} is missing: run `scripts/console-test-deps` (installs Debian's chromium and the \
         pinned playwright-core into crates/console/e2e/node_modules)"
    )
}

#[test]
fn the_console_works_in_a_real_browser() {
    let root = repository();
    let e2e = root.join("crates/console/e2e");
    let chromium = std::env::var_os("CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    if !chromium.is_file() {
        missing(&format!("{}", chromium.display()));
    }
    if !e2e
        .join("node_modules/playwright-core/package.json")
        .is_file()
    {
        missing("crates/console/e2e/node_modules/playwright-core");
    }
    let node_found = Command::new("node")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !node_found {
        missing("node");
    }

    let server = TestServer::start(&["--reference-token-delay", "20ms"]);
    let mut command = Command::new("node");
    command
        .arg(e2e.join("console.test.mjs"))
        .current_dir(&e2e)
        .env("LMSP_BASE_URL", &server.base)
        .env("LMSP_ADMIN_TOKEN", &server.admin_token)
        .env("CHROMIUM", &chromium)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(dir) = std::env::var_os("LMSP_CONSOLE_SCREENSHOTS") {
        command.env("LMSP_SCREENSHOTS", dir);
    }
    let mut child = command.spawn().expect("run node");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + BROWSER_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for node") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    eprintln!("{stdout}{stderr}");
    let status = status.unwrap_or_else(|| {
        panic!("the browser test did not finish within {BROWSER_DEADLINE:?}\n{stdout}{stderr}")
    });
    assert!(
        status.success(),
        "the browser test failed ({status}):\n{stdout}{stderr}"
    );
    assert!(
        stdout.contains("ok - no console errors and no CSP violations"),
        "{stdout}"
    );
}
