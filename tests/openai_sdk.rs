//! The official OpenAI Python SDK against the real binary: starts `lmsp serve` on a
//! temp data directory and port 0, pairs an application client, and runs
//! `tests/sdk/test_openai_sdk.py` with the venv's Python
//! (`target/openai-sdk-venv`, made by `scripts/openai-sdk-deps`), its output streamed into this
//! test's. The test fails when the program does not exit 0, and fails at once, saying what to
//! run, when the venv is missing: it never skips.
//!
//! Self-contained on purpose: it shares no harness with the other test targets of this crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;

use lmsp_tests as common;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The flags of every server: slow enough that a long response is still running when the SDK
/// cancels it; webhook retries 100 ms apart at first, so a receiver's failures are retried
/// within the test.
const SERVE_FLAGS: [&str; 4] = [
    "--reference-token-delay",
    "10ms",
    "--webhook-retry-base",
    "100ms",
];

/// The second server's extra flags: one worker (a second response waits `queued` behind a
/// running one) and an engine slow to stop (a cancelled response stays `cancelling` a while),
/// so that the SDK can cancel a response in each of those states.
// The engine takes 6 s to stop: longer than the 1 s a cancel of a running response waits, twice
// over, with room to look at the task while it is still `cancelling`.
const SLOW_FLAGS: [&str; 4] = ["--workers", "1", "--reference-cancel-delay", "6s"];

/// How long the server may take to start, and the SDK program to run.
const START_DEADLINE: Duration = Duration::from_secs(60);
const RUN_DEADLINE: Duration = Duration::from_secs(600);

/// A running `lmsp serve`, killed when dropped.
struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    base: String,
    admin_token: String,
    /// Every stderr line after the address, for a failure's report.
    log: Arc<Mutex<Vec<String>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Starts a server on a free port with the flags of [`SERVE_FLAGS`] and `extra`; on a first
    /// start it prints the admin token.
    fn start(data_dir: &Path, models_dir: &Path, extra: &[&str]) -> Self {
        Self::start_on(data_dir, models_dir, "127.0.0.1:0", None, extra)
    }

    /// Starts a server on `listen`; `admin_token` is the one a first start printed before.
    fn start_on(
        data_dir: &Path,
        models_dir: &Path,
        listen: &str,
        admin_token: Option<String>,
        extra: &[&str],
    ) -> Self {
        let mut child = Command::new(common::lmsp_binary())
            .arg("serve")
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--models-dir")
            .arg(models_dir)
            .args(["--listen", listen])
            .args(SERVE_FLAGS)
            .args(extra)
            .env("RUST_LOG", "warn")
            .env_remove("LMSP_LOG_FORMAT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("lmsp serve starts");
        let stderr = child.stderr.take().expect("the server's stderr");
        let (lines, received) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + START_DEADLINE;
        let mut admin_token = admin_token;
        let mut seen = Vec::new();
        let base = loop {
            let line = received
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|_| {
                    panic!("lmsp serve never printed its address; it wrote {seen:#?}")
                });
            if let Some(token) = line.strip_prefix("admin token (shown once): ") {
                admin_token = Some(token.trim().to_owned());
            }
            if let Some(address) = line.strip_prefix("lmsp listening on ") {
                break address.trim().to_owned();
            }
            seen.push(line);
        };
        let admin_token = admin_token
            .unwrap_or_else(|| panic!("a first start prints the admin token; it wrote {seen:#?}"));
        // Keep draining stderr, so that the server never blocks on a full pipe.
        let log = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&log);
        std::thread::spawn(move || {
            while let Ok(line) = received.recv() {
                kept.lock().unwrap().push(line);
            }
        });
        Self {
            child,
            base,
            admin_token,
            log,
        }
    }
}

/// Waits for `GET /v1/health` to answer 200.
async fn wait_healthy(http: &reqwest::Client, base: &str) {
    let deadline = Instant::now() + START_DEADLINE;
    let mut last = String::from("no answer");
    while Instant::now() < deadline {
        match http.get(format!("{base}/v1/health")).send().await {
            Ok(reply) if reply.status().is_success() => return,
            Ok(reply) => last = format!("status {}", reply.status()),
            Err(error) => last = error.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the server never became healthy: {last}");
}

/// Pairs a client with an application's scopes (no admin, no `models:write`) and returns its
/// token: the `api_key` an application gives the SDK.
async fn application_token(http: &reqwest::Client, base: &str, admin_token: &str) -> String {
    let scopes = json!(["responses:write", "responses:read", "models:read"]);
    let pairing: Value = http
        .post(format!("{base}/v1/pairings"))
        .bearer_auth(admin_token)
        .json(&json!({ "scopes": scopes }))
        .send()
        .await
        .expect("POST /v1/pairings is answered")
        .error_for_status()
        .expect("POST /v1/pairings succeeds")
        .json()
        .await
        .expect("a pairing");
    let code = pairing["code"].as_str().expect("a pairing code");
    let paired: Value = http
        .post(format!("{base}/v1/pair"))
        .json(&json!({"code": code, "name": "openai-sdk-test", "scopes": scopes}))
        .send()
        .await
        .expect("POST /v1/pair is answered")
        .error_for_status()
        .expect("POST /v1/pair succeeds")
        .json()
        .await
        .expect("a paired client");
    paired["token"].as_str().expect("a client token").to_owned()
}

#[test]
fn the_official_openai_python_sdk_works_against_the_service() {
    let root = common::workspace_root();
    let python = root.join("target/openai-sdk-venv/bin/python");
    let program = root.join("tests/sdk/test_openai_sdk.py");
    assert!(
        python.is_file(),
        "\n\n{} is missing: run `scripts/openai-sdk-deps` (from {}) to install the pinned \
         OpenAI Python SDK, then run this test again.\n\n",
        python.display(),
        root.display()
    );
    assert!(program.is_file(), "{} is missing", program.display());

    let temp = tempfile::tempdir().expect("a temp directory");
    let data_dir = temp.path().join("data");
    let models_dir = temp.path().join("models");
    std::fs::create_dir_all(&models_dir).expect("the models directory");
    let mut server = Server::start(&data_dir, &models_dir, &[]);
    let slow_dir = temp.path().join("slow");
    let slow = Server::start(
        &slow_dir.join("data"),
        &slow_dir.join("models"),
        &SLOW_FLAGS,
    );
    // The program asks for a kill -9 and restart by creating `restart` here; once the server on
    // the same address answers again, this test creates `restarted`.
    let control = temp.path().join("control");
    std::fs::create_dir_all(&control).expect("the control directory");

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("an HTTP client");
    let (token, slow_token) = runtime.block_on(async {
        wait_healthy(&http, &server.base).await;
        wait_healthy(&http, &slow.base).await;
        (
            application_token(&http, &server.base, &server.admin_token).await,
            application_token(&http, &slow.base, &slow.admin_token).await,
        )
    });

    let mut child = common::only_to_the_service(&mut Command::new(&python))
        .arg(&program)
        .current_dir(&root)
        .env("LMSP_BASE_URL", format!("{}/v1", server.base))
        .env("LMSP_TOKEN", &token)
        .env("LMSP_ADMIN_TOKEN", &server.admin_token)
        .env("LMSP_MODELS_DIR", &models_dir)
        .env("LMSP_CONTROL_DIR", &control)
        .env("LMSP_SLOW_BASE_URL", format!("{}/v1", slow.base))
        .env("LMSP_SLOW_TOKEN", &slow_token)
        .env("PYTHONUNBUFFERED", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    let out = common::forward(child.stdout.take().expect("stdout"), false);
    let err = common::forward(child.stderr.take().expect("stderr"), true);
    let deadline = Instant::now() + RUN_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().expect("the SDK program's status") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        if std::fs::remove_file(control.join("restart")).is_ok() {
            let listen = server.base.trim_start_matches("http://").to_owned();
            let admin_token = server.admin_token.clone();
            let _ = server.child.kill(); // SIGKILL: no graceful stop
            let _ = server.child.wait();
            server = Server::start_on(&data_dir, &models_dir, &listen, Some(admin_token), &[]);
            runtime.block_on(wait_healthy(&http, &server.base));
            std::fs::write(control.join("restarted"), b"").expect("the control file");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = out.join();
    let _ = err.join();
    let succeeded = status.is_some_and(|s| s.success());
    if !succeeded {
        for (name, server) in [("server", &server), ("second server", &slow)] {
            let log = server.log.lock().unwrap().clone();
            eprintln!("--- the {name}'s stderr ---\n{}", log.join("\n"));
        }
    }
    match status {
        None => panic!("the SDK program ran longer than {RUN_DEADLINE:?} and was killed"),
        Some(status) => assert!(
            status.success(),
            "the SDK program failed ({status}); its output is above"
        ),
    }
}
