//! Streams end to end (docs/events.md, docs/openai-sdk.md): `stream: true` on create, the native SSE stream of a
//! task's log with `Last-Event-ID`, and OpenAI's stream of a response with `starting_after`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lmsp_tests as common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{joined_deltas, prompt, SseMessage, SseStream, TestServer};
use serde_json::{json, Value};

/// The log events OpenAI has no type for, left out of its rendering.
const NOT_IN_OPENAI: [&str; 3] = [
    "response.loading",
    "response.cancelling",
    "response.resumed",
];

fn seqs(messages: &[SseMessage]) -> Vec<u64> {
    messages.iter().map(SseMessage::seq).collect()
}

/// Checks an OpenAI-rendered message: flat `{"type", "sequence_number", …}`, its `event:` and
/// `id:` agreeing with them; lifecycle events carry the whole response with the same `id`.
fn assert_openai_event(message: &SseMessage, response_id: &str) {
    let data = &message.data;
    assert_eq!(message.event.as_deref(), data["type"].as_str(), "{data}");
    if data["type"] == "error" {
        // The `error` frame renders the same stored event as the `response.failed` after it,
        // and has no SSE id, so that a resume after it replays both.
        assert!(message.id.is_none(), "{message:?}");
    } else {
        assert_eq!(
            Some(message.seq()),
            data["sequence_number"].as_u64(),
            "{data}"
        );
    }
    assert!(
        data.get("object").is_none(),
        "flat, not a log event: {data}"
    );
    let kind = data["type"].as_str().unwrap();
    match kind {
        "response.created"
        | "response.queued"
        | "response.in_progress"
        | "response.completed"
        | "response.failed"
        | "response.incomplete" => {
            assert_eq!(data["response"]["object"], "response", "{data}");
            assert_eq!(data["response"]["id"], response_id, "{data}");
        }
        "response.output_item.added" | "response.output_item.done" => {
            assert_eq!(data["item"]["type"], "message", "{data}");
            assert_eq!(data["item"]["role"], "assistant", "{data}");
            assert!(data["item"]["id"].as_str().unwrap().starts_with("msg_"));
            assert!(data["output_index"].is_u64(), "{data}");
        }
        "response.content_part.added" | "response.content_part.done" => {
            assert_eq!(data["part"]["type"], "output_text", "{data}");
        }
        "response.output_text.delta" => {
            assert!(data["delta"].is_string(), "{data}");
            assert_eq!(data["logprobs"], json!([]), "{data}");
            assert!(data["item_id"].as_str().unwrap().starts_with("msg_"));
            assert_eq!(data["content_index"], 0, "{data}");
        }
        "response.output_text.done" => assert!(data["text"].is_string(), "{data}"),
        "error" => assert!(data["code"].is_string(), "{data}"),
        other => panic!("an event type OpenAI's stream does not have: {other}"),
    }
}

/// The sequence numbers of a finished task's log that OpenAI's rendering shows.
fn openai_seqs_of(events: &[Value]) -> Vec<u64> {
    events
        .iter()
        .filter(|e| !NOT_IN_OPENAI.contains(&e["type"].as_str().unwrap()))
        .map(|e| e["sequence_number"].as_u64().unwrap())
        .collect()
}

/// `stream: true` answers 200 `text/event-stream` of OpenAI's events from the first
/// (`response.created`, sequence 1) to `response.completed`, then closes; the task's native log
/// has every event 1…n, and the stream shows exactly those OpenAI has a type for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_request_sends_every_event_then_closes() {
    let server = TestServer::start(&[]);
    let response = server
        .request(reqwest::Method::POST, "/v1/responses", &server.admin_token)
        .json(&json!({"model": "reference", "input": "hello", "stream": true, "max_output_tokens": 10}))
        .send()
        .await
        .unwrap();
    let mut stream = SseStream::of(response);
    let id = stream.header("lmsp-task-id");
    let messages = stream.collect_all().await;
    let first = &messages[0];
    assert_eq!(first.event.as_deref(), Some("response.created"));
    assert_eq!(first.seq(), 1);
    assert_eq!(first.data["response"]["status"], "queued");
    assert_eq!(first.data["response"]["task_id"], id.as_str());
    let response_id = first.data["response"]["id"].as_str().unwrap().to_owned();
    for message in &messages {
        assert_openai_event(message, &response_id);
    }
    let last = messages.last().unwrap();
    assert_eq!(last.event.as_deref(), Some("response.completed"));
    assert_eq!(last.data["response"]["status"], "completed");

    let task = server.wait_status(&id, "completed").await;
    let path = format!("/v1/tasks/{id}/events");
    let native = server.sse(&path, None).await.collect_all().await;
    let ids = seqs(&native);
    assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>());
    assert_eq!(
        task["last_sequence_number"].as_u64(),
        Some(ids.len() as u64)
    );
    assert_eq!(native[0].data["type"], "response.created");
    assert_eq!(native[0].data["object"], "event");
    assert_eq!(
        native.last().unwrap().event.as_deref(),
        Some("response.completed")
    );
    let events: Vec<Value> = native.iter().map(|m| m.data.clone()).collect();
    assert_eq!(seqs(&messages), openai_seqs_of(&events));
    let streamed: String = messages
        .iter()
        .filter(|m| m.data["type"] == "response.output_text.delta")
        .map(|m| m.data["delta"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(streamed, joined_deltas(&events));
    assert_eq!(last.data["response"]["output_text"], streamed.as_str());
}

/// I-2: SSE reconnect with `Last-Event-ID` receives every later event exactly once, each exactly
/// as the task's log stores it (the terminal event's response has the status that event implies).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sse_reconnect_with_last_event_id_gets_every_later_event_exactly_once() {
    let server = TestServer::start(&["--reference-token-delay", "20ms"]);
    let id = server.submit(prompt(11, 30, "fail")).await;
    let path = format!("/v1/tasks/{id}/events");
    let mut first = server.sse(&path, None).await;
    let mut seen = Vec::new();
    for _ in 0..5 {
        seen.push(first.next_message().await.unwrap());
    }
    drop(first);
    let last = seen.last().unwrap().seq();
    let rest = server.sse(&path, Some(last)).await.collect_all().await;
    seen.extend(rest);
    let ids = seqs(&seen);
    assert_eq!(
        ids,
        (1..=ids.len() as u64).collect::<Vec<_>>(),
        "every event exactly once, in order"
    );
    let task = server.wait_status(&id, "completed").await;
    assert_eq!(
        task["last_sequence_number"].as_u64(),
        Some(ids.len() as u64)
    );
    // What the stream showed live is what is stored, to the byte: the terminal event's
    // response is the completed one (with its output and usage), not the task as it was when
    // the stream opened.
    let stored = server.all_events(&id).await;
    let live: Vec<Value> = seen.iter().map(|m| m.data.clone()).collect();
    assert_eq!(live, stored);
    assert_eq!(
        live.last().unwrap()["data"]["response"]["status"],
        "completed"
    );
    // `?stream=true&after=N` is the same stream as `Last-Event-ID: N`.
    let by_query = server
        .sse(&format!("{path}?stream=true&after={last}"), None)
        .await
        .collect_all()
        .await;
    assert_eq!(
        seqs(&by_query),
        ((last + 1)..=ids.len() as u64).collect::<Vec<_>>()
    );
}

/// docs/openai-sdk.md: OpenAI's stream of a response (`GET /v1/responses/{id}?stream=true`) resumes with
/// `starting_after=N` (or `Last-Event-ID`) exactly once: a client that reads part of it, drops
/// it and reconnects after the last sequence number it saw gets every later event once, in
/// order, and the whole is the stream as it is once the task is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_stream_resumes_with_starting_after_exactly_once() {
    let server = TestServer::start(&["--reference-token-delay", "20ms"]);
    let accepted = server.submit_response(prompt(12, 40, "fail")).await;
    let response_id = accepted["id"].as_str().unwrap().to_owned();
    let task_id = accepted["task_id"].as_str().unwrap().to_owned();
    let path = format!("/v1/responses/{response_id}?stream=true");
    let mut first = server.sse(&path, None).await;
    assert_eq!(first.header("lmsp-task-id"), task_id);
    let mut seen = Vec::new();
    for _ in 0..6 {
        seen.push(first.next_message().await.unwrap());
    }
    drop(first);
    let last = seen.last().unwrap().seq();
    let mut second = server
        .sse(&format!("{path}&starting_after={last}"), None)
        .await;
    // A second drop, mid-output, resumed with `Last-Event-ID` this time.
    for _ in 0..4 {
        seen.push(second.next_message().await.unwrap());
    }
    drop(second);
    let last = seen.last().unwrap().seq();
    seen.extend(server.sse(&path, Some(last)).await.collect_all().await);

    let ids = seqs(&seen);
    let unique: BTreeSet<u64> = ids.iter().copied().collect();
    assert_eq!(ids.len(), unique.len(), "no event twice: {ids:?}");
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "in order: {ids:?}");
    for message in &seen {
        assert_openai_event(message, &response_id);
    }
    assert_eq!(seen[0].event.as_deref(), Some("response.created"));
    assert_eq!(
        seen.last().unwrap().event.as_deref(),
        Some("response.completed")
    );

    let task = server.wait_status(&task_id, "completed").await;
    let events = server.all_events(&task_id).await;
    assert_eq!(ids, openai_seqs_of(&events), "nothing missing");
    let whole = server.sse(&path, None).await.collect_all().await;
    assert_eq!(
        seqs(&whole),
        ids,
        "the same events as one uninterrupted stream"
    );
    for (resumed, uninterrupted) in seen.iter().zip(&whole) {
        assert_eq!(resumed.data, uninterrupted.data);
    }
    let text: String = seen
        .iter()
        .filter(|m| m.data["type"] == "response.output_text.delta")
        .map(|m| m.data["delta"].as_str().unwrap().to_owned())
        .collect();
    let (_, response) = server.get(&format!("/v1/responses/{response_id}")).await;
    assert_eq!(response["output_text"], text.as_str());
    assert_eq!(
        task["last_sequence_number"].as_u64(),
        events.last().unwrap()["sequence_number"].as_u64()
    );
    // Resumed at its last event, the stream of a finished response sends nothing and closes.
    let end = ids.last().copied().unwrap();
    let after_end = tokio::time::timeout(Duration::from_secs(30), async {
        server
            .sse(&format!("{path}&starting_after={end}"), None)
            .await
            .collect_all()
            .await
    })
    .await
    .expect("the stream after the end closes");
    assert!(after_end.is_empty(), "{after_end:?}");
}

/// docs/openai-sdk.md: a cancel ends OpenAI's stream with the response in status `cancelled`; the
/// `response.cancelling` of the log is left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_ends_the_openai_stream_with_a_cancelled_response() {
    let server = TestServer::start(&["--reference-token-delay", "30ms"]);
    let accepted = server.submit_response(prompt(13, 10_000, "fail")).await;
    let response_id = accepted["id"].as_str().unwrap().to_owned();
    let task_id = accepted["task_id"].as_str().unwrap().to_owned();
    let mut stream = server
        .sse(&format!("/v1/responses/{response_id}?stream=true"), None)
        .await;
    let mut seen = Vec::new();
    while let Some(message) = stream.next_message().await {
        let is_delta = message.data["type"] == "response.output_text.delta";
        seen.push(message);
        if is_delta {
            break;
        }
    }
    let (status, _, _) = server
        .post(&format!("/v1/responses/{response_id}/cancel"), Value::Null)
        .await;
    assert!(status == 200 || status == 202, "{status}");
    seen.extend(stream.collect_all().await);
    for message in &seen {
        assert_openai_event(message, &response_id);
    }
    let last = seen.last().unwrap();
    assert_eq!(
        last.data["response"]["status"], "cancelled",
        "{:?}",
        last.data
    );
    let task = server.wait_status(&task_id, "cancelled").await;
    assert_eq!(
        last.seq(),
        task["last_sequence_number"].as_u64().unwrap(),
        "the stream ends with the log's terminal event"
    );
}

/// docs/api.md, docs/openai-sdk.md: `stream: true` streams with `background: true` too; a failed task's stream
/// sends `error` with the task's error code, then `response.failed` carrying the response in
/// status `failed` with that error, and closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_task_ends_the_openai_stream_with_error_then_response_failed() {
    let server = TestServer::start(&[]);
    let path = server.data_dir.join("models").join("gone.txt");
    std::fs::write(&path, "the fox runs into the forest and the dog sleeps").unwrap();
    let (status, _, model) = server
        .post(
            "/v1/models",
            json!({"id": "gone", "path": path.to_string_lossy()}),
        )
        .await;
    assert_eq!(status, 201, "{model}");
    std::fs::remove_file(&path).unwrap();
    let response = server
        .request(reqwest::Method::POST, "/v1/responses", &server.admin_token)
        .json(&json!({"model": "gone", "input": "the fox", "background": true, "stream": true}))
        .send()
        .await
        .unwrap();
    let mut stream = SseStream::of(response);
    let task_id = stream.header("lmsp-task-id");
    let messages = stream.collect_all().await;
    let response_id = messages[0].data["response"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    for message in &messages {
        assert_openai_event(message, &response_id);
    }
    let kinds: Vec<&str> = messages
        .iter()
        .map(|m| m.data["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds.first(), Some(&"response.created"), "{kinds:?}");
    assert_eq!(
        &kinds[kinds.len() - 2..],
        ["error", "response.failed"],
        "{kinds:?}"
    );
    let error = &messages[messages.len() - 2].data;
    assert_eq!(error["code"], "model_unavailable", "{error}");
    let failed = &messages.last().unwrap().data["response"];
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["error"]["code"], "model_unavailable", "{failed}");
    let task = server.wait_status(&task_id, "failed").await;
    let last = task["last_sequence_number"].as_u64().unwrap();
    assert_eq!(messages.last().unwrap().seq(), last);
    // A client that saw the `error` frame resumes from the last id it saw (the event before):
    // it gets `error` and `response.failed` again, and nothing else.
    let resumed = server
        .request(
            reqwest::Method::GET,
            &format!(
                "/v1/responses/{response_id}?stream=true&starting_after={}",
                last - 1
            ),
            &server.admin_token,
        )
        .send()
        .await
        .unwrap();
    let again: Vec<String> = SseStream::of(resumed)
        .collect_all()
        .await
        .iter()
        .map(|m| m.data["type"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(again, ["error", "response.failed"]);
}

/// docs/events.md: a stream resumed at or past a task's terminal event (as a browser's `EventSource`
/// does after the server closed it) sends nothing more and closes, whether the task had already
/// finished or finishes later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_resumed_at_or_past_the_terminal_event_closes() {
    let server = TestServer::start(&["--reference-token-delay", "20ms"]);
    let finished = server.submit(prompt(21, 3, "fail")).await;
    let task = server.wait_status(&finished, "completed").await;
    let terminal = task["last_sequence_number"].as_u64().unwrap();
    let closes = |id: String, last: u64| {
        let server = &server;
        async move {
            let mut stream = server
                .sse(&format!("/v1/tasks/{id}/events"), Some(last))
                .await;
            tokio::time::timeout(Duration::from_secs(30), stream.collect_all())
                .await
                .unwrap_or_else(|_| panic!("the stream of {id} after {last} never closed"))
        }
    };
    assert!(closes(finished.clone(), terminal).await.is_empty());
    assert!(closes(finished, terminal + 50).await.is_empty());
    let running = server.submit(prompt(22, 10, "fail")).await;
    assert!(
        closes(running, 1_000).await.is_empty(),
        "past the end of a running task"
    );
}

/// I-6, docs/openai-sdk.md: a `resume` task's OpenAI stream survives a kill -9 of the server:
/// a client that read part of it reconnects to the restarted server with
/// `starting_after=<last sequence number it saw>` and gets every later event exactly once, the
/// sequence numbers continuing the log's; the text joined from the OpenAI deltas after the last
/// `response.queued` is the final `output_text`, and the same as an uninterrupted run's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_resume_tasks_openai_stream_resumes_after_the_restart_exactly_once_i6() {
    let mut server = TestServer::start(&["--reference-token-delay", "30ms"]);
    let accepted = server.submit_response(prompt(41, 200, "resume")).await;
    let response_id = accepted["id"].as_str().unwrap().to_owned();
    let task_id = accepted["task_id"].as_str().unwrap().to_owned();
    let path = format!("/v1/responses/{response_id}?stream=true");
    let mut first = server.sse(&path, None).await;
    let mut seen = Vec::new();
    while seen
        .iter()
        .filter(|m: &&SseMessage| m.data["type"] == "response.output_text.delta")
        .count()
        < 5
    {
        seen.push(first.next_message().await.expect("the stream runs"));
    }

    server.kill();
    drop(first);
    server.restart(&["--reference-token-delay", "5ms"]);
    let last = seen.last().unwrap().seq();
    let rest = server
        .sse(&format!("{path}&starting_after={last}"), None)
        .await
        .collect_all()
        .await;

    let task = server.wait_status(&task_id, "completed").await;
    let events = server.all_events(&task_id).await;
    let expected = openai_seqs_of(&events);
    assert!(
        events.iter().any(|e| e["type"] == "response.resumed"),
        "the task was resumed: {events:?}"
    );
    assert_eq!(task["restarts"], 1, "{task}");
    assert!(!rest.is_empty(), "the resumed stream sent nothing");
    let next = expected.iter().copied().find(|seq| *seq > last);
    assert_eq!(Some(rest[0].seq()), next, "the numbers continue the log's");
    seen.extend(rest);
    for message in &seen {
        assert_openai_event(message, &response_id);
    }
    let ids = seqs(&seen);
    assert_eq!(ids, expected, "every event exactly once, in order");
    assert_eq!(
        seen.last().unwrap().event.as_deref(),
        Some("response.completed")
    );
    let after_queued = seen
        .iter()
        .rposition(|m| m.data["type"] == "response.queued")
        .map_or(0, |i| i + 1);
    let text: String = seen[after_queued..]
        .iter()
        .filter(|m| m.data["type"] == "response.output_text.delta")
        .map(|m| m.data["delta"].as_str().unwrap().to_owned())
        .collect();
    let (_, response) = server.get(&format!("/v1/responses/{response_id}")).await;
    assert_eq!(response["output_text"], text.as_str(), "I-6");
    let (status, _, uninterrupted) = server.post("/v1/responses", prompt(41, 200, "fail")).await;
    assert_eq!(status, 200, "{uninterrupted}");
    assert_eq!(
        uninterrupted["output_text"],
        text.as_str(),
        "I-6: the same as an uninterrupted run"
    );
}
