//! The end-to-end harness: starts the real `lmsp` binary on port 0 with a temp data directory,
//! and speaks HTTP and SSE to it as a client would.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::Value;

/// The `lmsp` binary built by `cargo test --workspace` (next to this test's `deps` folder).
pub fn lmsp_binary() -> PathBuf {
    if let Ok(path) = std::env::var("LMSP_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("current exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target profile dir");
    let binary = profile_dir.join("lmsp");
    if !binary.exists() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", "lmsp", "--bin", "lmsp"])
            .status()
            .expect("cargo build");
        assert!(status.success(), "building lmsp failed");
    }
    binary
}

async fn reply_of(request: reqwest::RequestBuilder) -> (u16, reqwest::header::HeaderMap, Value) {
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    (
        status,
        headers,
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
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
    /// The data directory (kept across restarts).
    pub data_dir: PathBuf,
    _temp: Option<tempfile::TempDir>,
    /// An HTTP client.
    pub http: reqwest::Client,
    /// Every line the server wrote to stderr after it printed its address.
    log: Arc<Mutex<Vec<String>>>,
}

/// Lines the server wrote to stderr, for start-up parsing.
fn spawn_serve(
    data_dir: &Path,
    extra: &[&str],
    log_filter: &str,
) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(lmsp_binary())
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

impl TestServer {
    /// Starts a server on a new temp data directory.
    pub fn start(extra: &[&str]) -> Self {
        let temp = tempfile::tempdir().expect("tempdir");
        let data_dir = temp.path().join("data");
        let mut server = Self::start_in(&data_dir, String::new(), extra, "warn");
        server._temp = Some(temp);
        server
    }

    /// Starts a server that logs at `info` (one line per request); read them with
    /// [`TestServer::log_lines`].
    pub fn start_logging(extra: &[&str]) -> Self {
        let temp = tempfile::tempdir().expect("tempdir");
        let data_dir = temp.path().join("data");
        let mut server = Self::start_in(&data_dir, String::new(), extra, "info");
        server._temp = Some(temp);
        server
    }

    fn start_in(data_dir: &Path, admin_token: String, extra: &[&str], log_filter: &str) -> Self {
        let (child, lines) = spawn_serve(data_dir, extra, log_filter);
        let mut admin_token = admin_token;
        let deadline = Instant::now() + Duration::from_secs(60);
        let base = loop {
            let line = lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .expect("the server printed its address before the deadline");
            if let Some(token) = line.strip_prefix("admin token (shown once): ") {
                admin_token = token.trim().to_owned();
            }
            if let Some(address) = line.strip_prefix("lmsp listening on ") {
                break address.trim().to_owned();
            }
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
            data_dir: data_dir.to_path_buf(),
            _temp: None,
            http: reqwest::Client::new(),
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
        let temp = self._temp.take();
        let mut next = Self::start_in(&self.data_dir, self.admin_token.clone(), extra, "warn");
        next._temp = temp;
        std::mem::swap(self, &mut next);
        next._temp = None;
    }

    /// SIGKILLs the server.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
        child.wait().expect("wait")
    }

    /// Waits for a process that was sent SIGTERM to exit.
    pub fn terminate_wait(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        child.wait().expect("wait")
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// A full URL.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Runs `lmsp clients add` on the data directory and returns the token.
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
        String::from_utf8(output.stdout).unwrap().trim().to_owned()
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

    /// POST JSON with the admin token; returns status, headers and JSON body.
    pub async fn post(&self, path: &str, body: Value) -> (u16, reqwest::header::HeaderMap, Value) {
        let token = self.admin_token.clone();
        self.post_as(&token, path, body).await
    }

    /// POST JSON with a token.
    pub async fn post_as(
        &self,
        token: &str,
        path: &str,
        body: Value,
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        reply_of(self.request(reqwest::Method::POST, path, token).json(&body)).await
    }

    /// Sends a request and returns status, headers and JSON body (`null` when not JSON).
    pub async fn send(
        &self,
        request: reqwest::RequestBuilder,
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        reply_of(request).await
    }

    /// GET with the admin token; status and JSON body.
    pub async fn get(&self, path: &str) -> (u16, Value) {
        let token = self.admin_token.clone();
        self.get_as(&token, path).await
    }

    /// GET with a token.
    pub async fn get_as(&self, token: &str, path: &str) -> (u16, Value) {
        let response = self
            .request(reqwest::Method::GET, path, token)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// Submits a background task; returns its id.
    pub async fn submit(&self, mut body: Value) -> String {
        body["background"] = Value::Bool(true);
        let (status, _, task) = self.post("/v1/responses", body).await;
        assert_eq!(status, 202, "{task}");
        task["id"].as_str().unwrap().to_owned()
    }

    /// Polls a task until `done` holds for it, or panics at the deadline.
    pub async fn wait_task(&self, id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
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

    /// Opens an SSE stream of a task's events.
    pub async fn sse(&self, path: &str, last_event_id: Option<u64>) -> SseStream {
        let mut request = self
            .request(reqwest::Method::GET, path, &self.admin_token)
            .header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id.to_string());
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), 200);
        SseStream {
            body: Box::pin(response.bytes_stream()),
            buffer: String::new(),
        }
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
    /// `id:`.
    pub id: Option<String>,
    /// `event:`.
    pub event: Option<String>,
    /// `data:` parsed as JSON.
    pub data: Value,
}

/// A parsed SSE body.
pub struct SseStream {
    body: std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    buffer: String,
}

impl std::fmt::Debug for SseStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SseStream")
    }
}

impl SseStream {
    /// The next message (comments skipped), or `None` when the stream ended.
    pub async fn next_message(&mut self) -> Option<SseMessage> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut message = SseMessage {
                    id: None,
                    event: None,
                    data: Value::Null,
                };
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        message.id = Some(v.trim().to_owned());
                    } else if let Some(v) = line.strip_prefix("event:") {
                        message.event = Some(v.trim().to_owned());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if data.is_empty() {
                    continue;
                }
                message.data = serde_json::from_str(&data).unwrap_or(Value::Null);
                return Some(message);
            }
            let chunk = tokio::time::timeout(Duration::from_secs(60), self.body.next())
                .await
                .ok()??
                .ok()?;
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
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

/// Checks I-2 on a task's event list: 1…n gapless, one terminal event and it is last (when the
/// task is finished), and the task's `last_sequence_number` and status agree with the log.
pub fn assert_log_invariants(task: &Value, events: &[Value]) {
    for (index, event) in events.iter().enumerate() {
        assert_eq!(
            event["sequence_number"].as_u64(),
            Some(index as u64 + 1),
            "gapless: {events:?}"
        );
    }
    assert_eq!(
        task["last_sequence_number"].as_u64(),
        Some(events.len() as u64),
        "last seq: {task}"
    );
    let terminal = [
        "response.completed",
        "response.failed",
        "response.cancelled",
    ];
    let terminals = events
        .iter()
        .filter(|e| terminal.contains(&e["type"].as_str().unwrap_or("")))
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
