//! What the service refuses, end to end (docs/api.md, docs/openai-sdk.md): bad input of every kind gets its 4xx
//! with the error envelope and creates nothing (I-9); what LMSP cannot do is a 400 naming the
//! field; a slow request is answered 408, a malformed one 400; past the connection limit a
//! connection gets 503, and slow connections past the open-files limit cannot starve the service.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lmsp_tests as common;

use std::time::{Duration, Instant};

use common::{assert_envelope, TestServer, DEADLINE};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// I-9: bad input gets a 4xx with the error envelope and creates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_4xx_envelope_and_creates_nothing_i9() {
    let server = TestServer::start(&[]);
    let token = server.admin_token.clone();
    let post = |path: &str| server.request(reqwest::Method::POST, path, &token);
    let huge = "x".repeat(3 * 1024 * 1024);
    let rows: Vec<(&str, reqwest::RequestBuilder, u16, &str)> = vec![
        (
            "malformed json",
            post("/v1/responses")
                .header("content-type", "application/json")
                .body("{"),
            400,
            "invalid_request",
        ),
        (
            "a duplicate key",
            post("/v1/responses")
                .header("content-type", "application/json")
                .body(r#"{"model": "reference", "input": "x", "input": "y"}"#),
            400,
            "invalid_request",
        ),
        (
            "wrong type",
            post("/v1/responses").json(&json!({"model": "reference", "input": 5})),
            400,
            "invalid_request",
        ),
        (
            "empty input",
            post("/v1/responses").json(&json!({"model": "reference", "input": ""})),
            400,
            "invalid_request",
        ),
        (
            "no model",
            post("/v1/responses").json(&json!({"input": "x"})),
            400,
            "invalid_request",
        ),
        (
            "unknown field",
            post("/v1/responses").json(&json!({"model": "reference", "input": "x", "bogus": 1})),
            400,
            "invalid_request",
        ),
        (
            "range",
            post("/v1/responses")
                .json(&json!({"model": "reference", "input": "x", "max_output_tokens": 0})),
            400,
            "invalid_request",
        ),
        (
            "over the range",
            post("/v1/responses")
                .json(&json!({"model": "reference", "input": "x", "max_output_tokens": 100_001})),
            400,
            "invalid_request",
        ),
        (
            "unknown policy",
            post("/v1/responses")
                .json(&json!({"model": "reference", "input": "x", "on_restart": "never"})),
            400,
            "invalid_request",
        ),
        (
            "unknown role",
            post("/v1/responses").json(
                &json!({"model": "reference", "input": [{"role": "robot", "content": "x"}]}),
            ),
            400,
            "invalid_request",
        ),
        (
            "too much metadata",
            post("/v1/responses").json(&json!({
                "model": "reference", "input": "x",
                "metadata": (0..17).map(|i| (format!("k{i}"), json!("v"))).collect::<serde_json::Map<_, _>>()
            })),
            400,
            "invalid_request",
        ),
        (
            "unknown model",
            post("/v1/responses").json(&json!({"model": "nope", "input": "x"})),
            404,
            "model_not_found",
        ),
        (
            "unknown model for a chat",
            post("/v1/chat/completions")
                .json(&json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]})),
            404,
            "model_not_found",
        ),
        (
            "no messages",
            post("/v1/chat/completions").json(&json!({"model": "reference", "messages": []})),
            400,
            "invalid_request",
        ),
        (
            "no content type",
            post("/v1/responses").body("{}"),
            415,
            "unsupported_media_type",
        ),
        (
            "huge body",
            post("/v1/responses")
                .header("content-type", "application/json")
                .body(huge),
            413,
            "payload_too_large",
        ),
        (
            "huge body of the wrong type",
            post("/v1/responses")
                .header("content-type", "text/plain")
                .body("y".repeat(3 * 1024 * 1024)),
            415,
            "unsupported_media_type",
        ),
        (
            "no token",
            server
                .http
                .post(server.url("/v1/responses"))
                .json(&json!({"model": "reference", "input": "x"})),
            401,
            "unauthorized",
        ),
        (
            "bad token",
            server
                .request(reqwest::Method::POST, "/v1/responses", "lmsp_nope")
                .json(&json!({"model": "reference", "input": "x"})),
            401,
            "unauthorized",
        ),
        (
            "not a bearer token",
            server
                .http
                .post(server.url("/v1/responses"))
                .header("authorization", format!("Basic {token}"))
                .json(&json!({"model": "reference", "input": "x"})),
            401,
            "unauthorized",
        ),
        (
            "bad idempotency key",
            post("/v1/responses")
                .header("idempotency-key", "")
                .json(&json!({"model": "reference", "input": "x"})),
            400,
            "invalid_idempotency_key",
        ),
        (
            "malformed task id",
            server.request(reqwest::Method::GET, "/v1/tasks/task_..%2F..%2Fetc", &token),
            404,
            "not_found",
        ),
        (
            "unknown task id",
            server.request(
                reqwest::Method::GET,
                "/v1/tasks/task_01ARZ3NDEKTSV4RRFFQ69G5FAV",
                &token,
            ),
            404,
            "not_found",
        ),
        (
            "unknown response id",
            server.request(
                reqwest::Method::GET,
                "/v1/responses/resp_01ARZ3NDEKTSV4RRFFQ69G5FAV",
                &token,
            ),
            404,
            "not_found",
        ),
        (
            "a task id for a response",
            server.request(
                reqwest::Method::GET,
                "/v1/responses/task_01ARZ3NDEKTSV4RRFFQ69G5FAV",
                &token,
            ),
            404,
            "not_found",
        ),
        (
            "bad list limit",
            server.request(reqwest::Method::GET, "/v1/tasks?limit=0", &token),
            400,
            "invalid_request",
        ),
        (
            "unknown route",
            server.request(reqwest::Method::GET, "/v1/nothing", &token),
            404,
            "not_found",
        ),
        (
            "model path traversal",
            post("/v1/models").json(&json!({"id": "evil", "path": "../../etc/passwd"})),
            400,
            "invalid_request",
        ),
    ];
    for (name, request, status, code) in rows {
        // A refused body is read to its end first, so the client gets the reply, not a reset.
        let response = request
            .send()
            .await
            .unwrap_or_else(|error| panic!("{name}: {error}"));
        assert_eq!(response.status().as_u16(), status, "{name}");
        if status == 401 {
            assert_eq!(response.headers()["www-authenticate"], "Bearer", "{name}");
        }
        let body: Value = response.json().await.unwrap();
        assert_envelope(status, &body, code, name);
    }
    assert_eq!(server.task_count().await, 0, "nothing was created");
    let (_, models) = server.get("/v1/models").await;
    assert_eq!(
        models["data"].as_array().unwrap().len(),
        1,
        "only the reference model"
    );
}

/// docs/openai-sdk.md, I-9: what LMSP cannot do (tools, images, reasoning, other output formats, more
/// than one choice) is a 400 whose `param` names the field, never silently ignored; nothing is
/// created. What it accepts of OpenAI's requests (`instructions`, content parts, `developer`,
/// `store`, `user`, `{"type": "message"}` items) works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_lmsp_cannot_do_is_a_400_naming_the_field() {
    let server = TestServer::start(&[]);
    let rows: Vec<(&str, &str, Value, &str)> = vec![
        (
            "a tool that is not a function",
            "/v1/responses",
            json!({"model": "reference", "input": "x", "tools": [{"type": "web_search"}]}),
            "tools[0].type",
        ),
        (
            "an image",
            "/v1/responses",
            json!({"model": "reference", "input": [{"role": "user", "content": [
                {"type": "input_image", "image_url": "http://example.com/cat.png"}]}]}),
            "input[0].content[0].type",
        ),
        (
            "reasoning",
            "/v1/responses",
            json!({"model": "reference", "input": "x", "reasoning": {"effort": "high"}}),
            "reasoning",
        ),
        (
            "an output format that is not text or JSON",
            "/v1/responses",
            json!({"model": "reference", "input": "x",
                   "text": {"format": {"type": "grammar"}}}),
            "text.format.type",
        ),
        (
            "a chat with tools",
            "/v1/chat/completions",
            json!({"model": "reference", "messages": [{"role": "user", "content": "x"}],
                   "tools": [{"type": "file_search"}]}),
            "tools[0].type",
        ),
        (
            "several choices",
            "/v1/chat/completions",
            json!({"model": "reference", "messages": [{"role": "user", "content": "x"}], "n": 2}),
            "n",
        ),
    ];
    for (name, path, body, param) in rows {
        let (status, _, reply) = server.post(path, body).await;
        assert_eq!(status, 400, "{name}: {reply}");
        assert_envelope(status, &reply, "invalid_request", name);
        assert_eq!(reply["error"]["param"], param, "{name}: {reply}");
    }
    assert_eq!(server.task_count().await, 0, "nothing was created");

    let (status, _, accepted) = server
        .post(
            "/v1/responses",
            json!({
                "model": "reference", "instructions": "Tell a story.", "store": true,
                "user": "someone", "max_output_tokens": 4, "seed": 1,
                "input": [
                    {"role": "developer", "content": "Be brief."},
                    {"type": "message", "role": "user",
                     "content": [{"type": "input_text", "text": "Once upon a time"}]}
                ]
            }),
        )
        .await;
    assert_eq!(status, 200, "{accepted}");
    assert_eq!(accepted["status"], "completed");
    assert_eq!(accepted["instructions"], "Tell a story.");
    assert_eq!(accepted["usage"]["output_tokens"], 4);
}

/// Sends raw bytes and reads the reply until the server closes (bounded).
async fn raw_exchange(stream: &mut TcpStream, bytes: &[u8]) -> String {
    stream.write_all(bytes).await.unwrap();
    let mut reply = Vec::new();
    tokio::time::timeout(DEADLINE, stream.read_to_end(&mut reply))
        .await
        .expect("the server answered and closed")
        .unwrap();
    String::from_utf8_lossy(&reply).into_owned()
}

/// The JSON body of a raw HTTP reply (`Null` when it has none).
fn body_of(reply: &str) -> Value {
    let body = reply.split("\r\n\r\n").nth(1).unwrap_or_default();
    serde_json::from_str(body).unwrap_or(Value::Null)
}

fn address(server: &TestServer) -> String {
    server.base.trim_start_matches("http://").to_owned()
}

/// docs/api.md: a request whose headers do not arrive within the request timeout is answered 408
/// with the envelope (`invalid_request`) and closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_too_slow_is_answered_408_with_the_envelope() {
    let server = TestServer::start(&["--request-timeout", "1s"]);
    let mut stream = TcpStream::connect(address(&server)).await.unwrap();
    let reply = raw_exchange(&mut stream, b"GET /v1/health HTTP/1.1\r\nHost: x\r\n").await;
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    let body = body_of(&reply);
    assert_envelope(408, &body, "invalid_request", "408");
}

/// docs/api.md: past the connection limit, a new connection gets 503 `service_unavailable` with
/// `Retry-After` (raw, and through an HTTP client library); once a connection closes, new ones
/// are served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_connection_limit_a_connection_gets_503() {
    let server = TestServer::start(&["--max-connections", "2"]);
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(TcpStream::connect(address(&server)).await.unwrap());
    }
    // The two held connections are open (a request on one of them is served).
    held[0]
        .write_all(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut first = [0_u8; 12];
    tokio::time::timeout(DEADLINE, held[0].read_exact(&mut first))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    let mut third = TcpStream::connect(address(&server)).await.unwrap();
    let reply = raw_exchange(
        &mut third,
        b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
    assert!(
        reply.to_ascii_lowercase().contains("retry-after:"),
        "{reply}"
    );
    let body = body_of(&reply);
    assert_envelope(503, &body, "service_unavailable", "503");
    // An HTTP client library, which sends its whole request before it reads, gets the same
    // refusal as a reply (not a broken connection), a submit with a body included.
    let fresh = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let refused = fresh
        .post(server.url("/v1/responses"))
        .bearer_auth(&server.admin_token)
        .json(&json!({"model": "reference", "input": "x", "background": true}))
        .send()
        .await
        .expect("the refusal is a reply");
    assert_eq!(refused.status().as_u16(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    let body: Value = refused.json().await.unwrap();
    assert_envelope(503, &body, "service_unavailable", "503");
    drop(held.pop());
    // Once a connection closes a new one is served: the admin's task list, which also shows
    // that the refused submit created nothing.
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (status, page) = server.get("/v1/tasks?limit=100").await;
        if status == 200 {
            assert_eq!(page["data"], json!([]), "a refused submit creates nothing");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a freed connection was never reused: {status} {page}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// docs/api.md: a URI or headers too large are answered 414 / 431, still with the envelope
/// (`invalid_request`), and the connection is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_uri_or_headers_too_large_get_414_or_431_with_the_envelope() {
    let server = TestServer::start(&[]);
    let long_uri = format!(
        "GET /v1/health?q={} HTTP/1.1\r\nHost: x\r\n\r\n",
        "x".repeat(200_000)
    );
    let many_headers = format!(
        "GET /v1/health HTTP/1.1\r\nHost: x\r\n{}\r\n",
        (0..200)
            .map(|i| format!("X-H{i}: v\r\n"))
            .collect::<String>()
    );
    for (name, request, status) in [("uri", long_uri, "414"), ("headers", many_headers, "431")] {
        let mut stream = TcpStream::connect(address(&server)).await.unwrap();
        let reply = raw_exchange(&mut stream, request.as_bytes()).await;
        assert!(
            reply.starts_with(&format!("HTTP/1.1 {status}")),
            "{name}: {reply}"
        );
        let body = body_of(&reply);
        assert_envelope(status.parse().unwrap(), &body, "invalid_request", name);
    }
}

/// docs/api.md: a malformed request line is answered 400 with the envelope (`invalid_request`),
/// not an empty reply, and the connection is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_request_line_gets_400_with_the_envelope() {
    let server = TestServer::start(&[]);
    let mut stream = TcpStream::connect(address(&server)).await.unwrap();
    let reply = raw_exchange(&mut stream, b"THIS IS NOT HTTP\r\n\r\n").await;
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");
    let body = body_of(&reply);
    assert_envelope(400, &body, "invalid_request", "400");
}

/// docs/api.md: a request body that stalls for the request timeout is answered 408 with the
/// envelope and the connection closed; nothing is created (I-9).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_is_answered_408_and_creates_nothing_i9() {
    let server = TestServer::start(&["--request-timeout", "1s"]);
    let mut stream = TcpStream::connect(address(&server)).await.unwrap();
    let head = format!(
        "POST /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: 200\r\n\r\n{{\"model\": ",
        server.admin_token
    );
    let reply = raw_exchange(&mut stream, head.as_bytes()).await;
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    let body = body_of(&reply);
    assert_envelope(408, &body, "invalid_request", "408");
    assert_eq!(server.task_count().await, 0);
}

/// Sends `request` (raw HTTP/1.1 with `Connection: close`) on a fresh connection until it is
/// answered (any HTTP reply) or the deadline passes; the reply's status and JSON body. A
/// connection the server closes without a reply (past its bound on refusals) is tried again.
async fn answered_within(
    server: &TestServer,
    request: &str,
    within: Duration,
    what: &str,
) -> (u16, Value) {
    let deadline = Instant::now() + within;
    loop {
        let attempt = tokio::time::timeout(Duration::from_secs(1), async {
            let mut stream = TcpStream::connect(address(server)).await.ok()?;
            let _ = stream.write_all(request.as_bytes()).await;
            let mut reply = Vec::new();
            let _ = stream.read_to_end(&mut reply).await;
            let reply = String::from_utf8_lossy(&reply).into_owned();
            let status: u16 = reply.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
            Some((status, body_of(&reply)))
        })
        .await;
        if let Ok(Some(answer)) = attempt {
            return answer;
        }
        assert!(
            Instant::now() < deadline,
            "{what} was never answered within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

const HEALTH: &str = "GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

/// With an open-files limit of 256, 300 connections that never finish their headers cannot
/// starve the service: the connection limit is fitted below the limit, so while they are held
/// health and a submit are still answered (200/202, or 503 with the envelope and
/// `Retry-After`), the slow ones get 408 at the request timeout (or 503, or are closed past the
/// limit), and then health and submits are served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_connections_past_the_open_files_limit_cannot_starve_the_service() {
    let server = TestServer::start_wrapped(
        &["sh", "-c", "ulimit -n 256 && exec \"$0\" \"$@\""],
        &["--request-timeout", "10s"],
        "warn",
    );
    let mut slow = Vec::new();
    for _ in 0..300 {
        let mut stream = TcpStream::connect(address(&server)).await.unwrap();
        // Headers that never end; a connection closed at once cannot take them (ignored).
        let _ = stream
            .write_all(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")
            .await;
        slow.push(stream);
    }
    // Well within the request timeout, so every slow connection the server took still holds
    // its descriptor meanwhile.
    let within = Duration::from_secs(5);
    let (status, body) = answered_within(&server, HEALTH, within, "health").await;
    assert!(
        status == 200 || (status == 503 && body["error"]["code"] == "service_unavailable"),
        "health while slow connections are held: {status} {body}"
    );
    let submit_body = json!({"model": "reference", "input": "x", "background": true,
                             "max_output_tokens": 1})
    .to_string();
    let submit = format!(
        "POST /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
        server.admin_token,
        submit_body.len(),
        submit_body
    );
    let (status, body) = answered_within(&server, &submit, within, "a submit").await;
    assert!(
        status == 202 || (status == 503 && body["error"]["code"] == "service_unavailable"),
        "a submit while slow connections are held: {status} {body}"
    );

    let mut timed_out = 0;
    for mut stream in slow {
        let mut reply = Vec::new();
        // A connection the server closed at once may end in a reset: no reply, which is fine.
        let _ = tokio::time::timeout(DEADLINE, stream.read_to_end(&mut reply))
            .await
            .expect("every slow connection ends");
        let reply = String::from_utf8_lossy(&reply);
        if reply.starts_with("HTTP/1.1 408") {
            timed_out += 1;
        } else {
            assert!(
                reply.is_empty() || reply.starts_with("HTTP/1.1 503"),
                "a slow connection got: {reply}"
            );
        }
    }
    assert!(
        timed_out > 0,
        "no slow connection was served until its timeout"
    );

    let (status, _) = answered_within(&server, HEALTH, DEADLINE, "health").await;
    assert_eq!(status, 200, "health once the slow connections are gone");
    let created = server
        .post(
            "/v1/responses",
            json!({"model": "reference", "input": "x", "background": true, "max_output_tokens": 1}),
        )
        .await;
    assert_eq!(created.0, 202, "{}", created.2);
    eprintln!("fd limit 256: 300 slow connections, {timed_out} answered 408, health and submits answered throughout");
}
