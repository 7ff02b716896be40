//! The official OpenAI Node SDK (npm `openai`, pinned in tests/sdk-node/package-lock.json)
//! against the real binary: starts `lmsp serve` (the shared [`TestServer`]), pairs an
//! application client through the admin token, and runs
//! `node --test batches.test.mjs webhooks.test.mjs tools.test.mjs` (in tests/sdk-node) —
//! Responses, then the Files + Batch API (upload, create, retrieve, download) for
//! `/v1/responses` and `/v1/chat/completions`; webhooks: a receiver on 127.0.0.1 registered by
//! the admin, a background response's `response.completed` and a test delivery verified with
//! the SDK's `webhooks.unwrap`; and a function tool's loop on both APIs, streamed and not, and
//! structured outputs through `responses.parse` and `chat.completions.parse` (the README's
//! JavaScript example) — its output streamed into this test's. The test fails when the program does
//! not exit 0, and fails at once, saying what to run, when the SDK (installed by
//! `scripts/openai-node-deps`) or node is missing: it never skips.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lmsp_tests as common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::TestServer;

/// A reference engine fast enough for a few batches, slow enough to be a real stream.
const SERVE_FLAGS: [&str; 2] = ["--reference-token-delay", "5ms"];

/// The `node --test` files in tests/sdk-node, run by one invocation (each file in a process of
/// its own).
const PROGRAMS: [&str; 3] = ["batches.test.mjs", "webhooks.test.mjs", "tools.test.mjs"];

/// How long the whole node program may take (each batch it waits for has 60 s of its own, each
/// webhook delivery 30 s).
const RUN_DEADLINE: Duration = Duration::from_secs(300);

fn missing(what: &str) -> ! {
    panic!(
        "\n\n{what} is missing: run `scripts/openai-node-deps` (from {}) to install the pinned \
         OpenAI Node SDK into tests/sdk-node/node_modules (`npm ci`; needs node and npm 18+), \
         then run this test again.\n\n",
        common::workspace_root().display()
    )
}

#[test]
fn the_official_openai_node_sdk_runs_batches_webhooks_and_tools_against_the_service() {
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
    let token = runtime.block_on(server.application_token("openai-node-test"));

    let started = Instant::now();
    let mut command = Command::new("node");
    command
        .arg("--test")
        .arg("--test-reporter=spec")
        .args(PROGRAMS)
        .current_dir(&dir)
        .env("LMSP_BASE_URL", server.url("/v1"))
        .env("LMSP_TOKEN", &token)
        // The webhook endpoint API is admin only.
        .env("LMSP_ADMIN_TOKEN", &server.admin_token)
        .env("NO_COLOR", "1");
    common::only_to_the_service(&mut command);
    let status = common::run_forwarded(&mut command, RUN_DEADLINE);
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
