//! The clients people use, against a real model: SmolLM2 135M Instruct (`scripts/smollm2-model`)
//! behind the real binary, driven by the pinned official OpenAI Python SDK
//! (`tests/sdk/test_real_models.py`: tool loops on Responses and Chat, streamed and not,
//! `responses.parse` / `chat.completions.parse` with pydantic models, `stop`, log probabilities)
//! and by LangChain's OpenAI integration (`tests/langchain/test_langchain.py`: `bind_tools`,
//! `with_structured_output`).
//!
//! The Python program runs twice, unchanged: against `lmsp serve --engine llama` (the model in
//! process, its grammars forcing calls and formats), and against `lmsp serve --engine openai` in
//! front of llama.cpp's own server (the pinned xllamacpp serving the same file through
//! `tests/llamacpp/serve.py`, with the tool-call chat template
//! `tests/llamacpp/smollm2-tools.jinja`). Each program's output is streamed into its test's;
//! a test fails when its program does not exit 0, and fails at once, naming the script that
//! installs it, when a venv, the model or llama.cpp's server is missing: it never skips.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use lmsp_tests as common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{LlamaCppServer, TestServer};
use serde_json::json;

/// How long one program may run (each takes seconds; this bounds a hang).
const RUN_DEADLINE: Duration = Duration::from_secs(300);

/// A venv's Python, which must be there: `script` installs it.
fn venv_python(venv: &str, script: &str) -> PathBuf {
    let root = common::workspace_root();
    let python = root.join(venv).join("bin/python");
    assert!(
        python.is_file(),
        "\n\n{} is missing: run `{script}` (from {}), then run this test again.\n\n",
        python.display(),
        root.display()
    );
    python
}

/// An application's token for `server`, made through its admin token.
fn application_token(server: &TestServer, name: &str) -> String {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(server.application_token(name))
}

/// A SmolLM2 server on `--engine llama`, the model registered as `smollm2`.
fn smollm2_in_process() -> TestServer {
    let server = common::server_with_smollm2("1");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(common::register_smollm2(&server));
    server
}

/// Runs `program` (under tests/) with `python`, pointed at `server`'s `/v1` with `token` and the
/// model `smollm2`, plus `env`; panics, with the server's log, unless it exits 0.
fn run_python(
    python: &Path,
    program: &str,
    server: &TestServer,
    token: &str,
    env: &[(&str, &str)],
) {
    let root = common::workspace_root();
    let program = root.join("tests").join(program);
    assert!(program.is_file(), "{} is missing", program.display());
    let mut command = Command::new(python);
    command
        .arg(&program)
        .current_dir(&root)
        .env("LMSP_BASE_URL", server.url("/v1"))
        .env("LMSP_TOKEN", token)
        .env("LMSP_MODEL", "smollm2")
        .env("PYTHONUNBUFFERED", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1");
    // Whatever the environment says, the clients talk to this server only (`env` may route
    // every other host to nowhere on top).
    common::only_to_the_service(&mut command);
    for (name, value) in env {
        command.env(name, value);
    }
    let started = Instant::now();
    let status = common::run_forwarded(&mut command, RUN_DEADLINE);
    eprintln!("{} ran {:?}", program.display(), started.elapsed());
    if !status.is_some_and(|s| s.success()) {
        eprintln!(
            "--- the server's stderr ---\n{}",
            server.log_lines().join("\n")
        );
    }
    match status {
        None => panic!(
            "{} ran longer than {RUN_DEADLINE:?} and was killed",
            program.display()
        ),
        Some(status) => assert!(
            status.success(),
            "{} failed ({status}); its output is above",
            program.display()
        ),
    }
}

/// The official OpenAI Python SDK on SmolLM2 run in process (`--engine llama`): a tool loop (a
/// call forced by `tool_choice` "required", whose arguments validate, its output sent back, a
/// text answer under "none") on Responses and on Chat, streamed and not; a pydantic function
/// tool's parsed arguments; `responses.parse` and `chat.completions.parse` returning pydantic
/// objects that validate, greedy and sampled; `stop`; log probabilities.
#[test]
fn openai_python_tools_structured_outputs_stop_and_logprobs_on_smollm2_in_process() {
    let python = venv_python("target/openai-sdk-venv", "scripts/openai-sdk-deps");
    let server = smollm2_in_process();
    let token = application_token(&server, "sdk-real-models");
    run_python(
        &python,
        "sdk/test_real_models.py",
        &server,
        &token,
        &[("LMSP_ENGINE", "llama")],
    );
}

/// The same program through the upstream engine (`--engine openai`) in front of llama.cpp's
/// own server serving SmolLM2 with a tool-call chat template: every check holds through
/// llama.cpp's grammars, its parsing of calls and its log probabilities.
#[test]
fn openai_python_tools_structured_outputs_stop_and_logprobs_through_llama_cpps_server() {
    let python = venv_python("target/openai-sdk-venv", "scripts/openai-sdk-deps");
    let template = common::workspace_root().join("tests/llamacpp/smollm2-tools.jinja");
    let template = template.to_str().expect("a UTF-8 path");
    let upstream = LlamaCppServer::start(
        &common::smollm2_file(),
        &["--threads", "1", "--jinja", "--chat-template", template],
    );
    let server = TestServer::start(&[
        "--engine",
        "openai",
        "--upstream",
        &upstream.api,
        "--workers",
        "1",
    ]);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(async {
            let (status, _, model) = server
                .post(
                    "/v1/models",
                    json!({"id": "smollm2", "upstream_model": "smollm2"}),
                )
                .await;
            assert_eq!(status, 201, "{model}");
        });
    let token = application_token(&server, "sdk-real-models");
    run_python(
        &python,
        "sdk/test_real_models.py",
        &server,
        &token,
        &[("LMSP_ENGINE", "openai")],
    );
}

/// LangChain's `ChatOpenAI` (pinned langchain-openai, `scripts/langchain-deps`) on SmolLM2 run in
/// process: `bind_tools` makes a call whose arguments validate and its `ToolMessage` gets a text
/// answer, and `with_structured_output(Person, method="json_schema")` returns a `Person`, over
/// Chat Completions and the Responses API. Every host but the service's is behind a proxy that
/// leads nowhere, and tiktoken's cache is empty, so anything fetched at run time fails the test.
#[test]
fn langchain_bind_tools_and_with_structured_output_on_smollm2() {
    let python = venv_python("target/langchain-venv", "scripts/langchain-deps");
    let server = smollm2_in_process();
    let token = application_token(&server, "langchain");
    let nowhere = format!("http://127.0.0.1:{}", common::free_port());
    let tiktoken_cache = tempfile::tempdir().expect("a temp directory");
    run_python(
        &python,
        "langchain/test_langchain.py",
        &server,
        &token,
        &[
            ("HTTP_PROXY", &nowhere),
            ("HTTPS_PROXY", &nowhere),
            ("ALL_PROXY", &nowhere),
            ("NO_PROXY", "127.0.0.1,localhost"),
            (
                "TIKTOKEN_CACHE_DIR",
                tiktoken_cache.path().to_str().unwrap(),
            ),
            ("LANGSMITH_TRACING", "false"),
            ("LANGCHAIN_TRACING_V2", "false"),
        ],
    );
}
