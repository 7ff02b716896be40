//! The official OpenAI Node SDK (npm `openai`, pinned in tests/sdk-node/package-lock.json)
//! against the real binary: starts `lmsp serve` (the shared [`TestServer`]), pairs an
//! application client through the admin token, and runs
//! `node --test tests/sdk-node/batches.test.mjs tests/sdk-node/webhooks.test.mjs` — Responses,
//! then the Files + Batch API (upload, create, retrieve, download) for `/v1/responses` and
//! `/v1/chat/completions`; and webhooks: a receiver on 127.0.0.1 registered by the admin, a
//! background response's `response.completed` and a test delivery verified with the SDK's
//! `webhooks.unwrap` — its output streamed into this test's. The test fails when the program does
//! not exit 0, and fails at once, saying what to run, when the SDK (installed by
//! `scripts/openai-node-deps`) or node is missing: it never skips.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lmsp_tests as common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::TestServer;
use serde_json::json;

/// A reference engine fast enough for a few batches, slow enough to be a real stream.
const SERVE_FLAGS: [&str; 2] = ["--reference-token-delay", "5ms"];

/// The `node --test` files in tests/sdk-node, run by one invocation (each file in a process of
/// its own).
const PROGRAMS: [&str; 2] = ["batches.test.mjs", "webhooks.test.mjs"];

/// How long the whole node program may take (each batch it waits for has 60 s of its own, each
/// webhook delivery 30 s).
const RUN_DEADLINE: Duration = Duration::from_secs(300);

/// The scopes an application gets: no admin, no `models:write`.
const SCOPES: [&str; 3] = ["responses:write", "responses:read", "models:read"];

fn missing(what: &str) -> ! {
    panic!(
        "\n\n{what} is missing: run `scripts/openai-node-deps` (from {}) to install the pinned \
         OpenAI Node SDK into tests/sdk-node/node_modules (`npm ci`; needs node and npm 18+), \
         then run this test again.\n\n",
        common::workspace_root().display()
    )
}

/// Pairs a client with [`SCOPES`] through the admin token and returns its token: the `apiKey`
/// an application gives the SDK.
async fn application_token(server: &TestServer) -> String {
    let (status, _, pairing) = server
        .post("/v1/pairings", json!({ "scopes": SCOPES }))
        .await;
    assert_eq!(status, 201, "POST /v1/pairings: {pairing}");
    let code = pairing["code"].as_str().expect("a pairing code");
    let (status, _, paired) = server
        .send(
            server
                .http
                .post(server.url("/v1/pair"))
                .json(&json!({ "code": code, "name": "openai-node-test", "scopes": SCOPES })),
        )
        .await;
    assert_eq!(status, 201, "POST /v1/pair: {paired}");
    paired["token"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("a client token in {paired}"))
}

/// Copies a child's output, line by line, into this test's output (shown when it fails, or
/// live with `--nocapture`).
fn forward(output: impl Read + Send + 'static, to_stderr: bool) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(output).lines().map_while(Result::ok) {
            if to_stderr {
                eprintln!("{line}");
            } else {
                println!("{line}");
            }
        }
    })
}

#[test]
fn the_official_openai_node_sdk_runs_batches_and_webhooks_against_the_service() {
    let root = common::workspace_root();
    let dir = root.join("tests/sdk-node");
    for program in PROGRAMS {
        let path = dir.join(program);
        assert!(path.is_file(), "{} is missing", path.display());
    }
    if !dir.join("node_modules/openai/package.json").is_file() {
        missing("tests/sdk-node/node_modules/openai");
    }
    let node_found = Command::new("node")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !node_found {
        missing("node");
    }

    let server = TestServer::start(&SERVE_FLAGS);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let token = runtime.block_on(application_token(&server));

    let started = Instant::now();
    let mut child = Command::new("node")
        .arg("--test")
        .arg("--test-reporter=spec")
        .args(PROGRAMS)
        .current_dir(&dir)
        .env("LMSP_BASE_URL", server.url("/v1"))
        .env("LMSP_TOKEN", &token)
        // The webhook endpoint API is admin only.
        .env("LMSP_ADMIN_TOKEN", &server.admin_token)
        // Whatever the environment says, the SDK talks to this server only.
        .env_remove("OPENAI_BASE_URL")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_WEBHOOK_SECRET")
        .env_remove("OPENAI_ORG_ID")
        .env_remove("OPENAI_PROJECT_ID")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("ALL_PROXY")
        .env("NO_PROXY", "*")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run node: {e}"));
    let out = forward(child.stdout.take().expect("stdout"), false);
    let err = forward(child.stderr.take().expect("stderr"), true);
    let status = loop {
        if let Some(status) = child.try_wait().expect("the node program's status") {
            break Some(status);
        }
        if started.elapsed() >= RUN_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = out.join();
    let _ = err.join();
    eprintln!("the node program ran {:?}", started.elapsed());
    if !status.is_some_and(|s| s.success()) {
        eprintln!(
            "--- the server's stderr ---\n{}",
            server.log_lines().join("\n")
        );
    }
    match status {
        None => panic!("the node program ran longer than {RUN_DEADLINE:?} and was killed"),
        Some(status) => assert!(
            status.success(),
            "`node --test {}` (in tests/sdk-node) failed ({status}); its output is above",
            PROGRAMS.join(" ")
        ),
    }
}
