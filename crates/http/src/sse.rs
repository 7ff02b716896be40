//! Server-Sent Events: a task's log as a stream, in each of its renderings. Every frame carries
//! the log's sequence number as its `id`, so a client reconnecting with `Last-Event-ID` (or
//! `starting_after`) gets every later event exactly once. A comment keeps the connection alive
//! every 15 s; when the service stops for good, a stream ends at an event boundary.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::stream::{self, BoxStream, Stream, StreamExt};

use lmsp_domain::{Event, Task};

use crate::wire::chat::{Chunk, ChunkRenderer};
use crate::wire::native;
use crate::wire::openai::StreamRenderer;

const KEEP_ALIVE: Duration = Duration::from_secs(15);

fn respond(
    frames: impl Stream<Item = SseEvent> + Send + 'static,
    stopping: impl std::future::Future<Output = ()> + Send + 'static,
) -> Response {
    let frames = frames.take_until(stopping).map(Ok::<_, Infallible>);
    Sse::new(frames)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response()
}

fn json_frame(data: &impl serde::Serialize) -> String {
    // An event always renders; were it ever not to, the frame says so instead of panicking.
    serde_json::to_string(data).unwrap_or_else(|_| String::from(r#"{"error": "unrenderable"}"#))
}

/// The LMSP-native rendering: every stored event, `event: <type>`, `data: <event object>`.
pub fn native_stream(
    events: BoxStream<'static, Event>,
    task: Task,
    stopping: impl std::future::Future<Output = ()> + Send + 'static,
) -> Response {
    let frames = events.scan(task, |task, event| {
        task.items.follow(&event.payload);
        let data = json_frame(&native::event(&event, task));
        let frame = SseEvent::default()
            .id(event.sequence_number.to_string())
            .event(event.kind().name())
            .data(data);
        std::future::ready(Some(frame))
    });
    respond(frames, stopping)
}

/// The OpenAI rendering: OpenAI's flat stream events.
pub fn openai_stream(
    events: BoxStream<'static, Event>,
    renderer: StreamRenderer,
    stopping: impl std::future::Future<Output = ()> + Send + 'static,
) -> Response {
    let frames = events
        .scan(renderer, |renderer, event| {
            let rendered = renderer.render(&event);
            std::future::ready(Some(stream::iter(rendered)))
        })
        .flatten()
        .map(|rendered| {
            let frame = SseEvent::default()
                .event(rendered.kind)
                .data(json_frame(&rendered.data));
            // The `error` frame renders the same stored event as the `response.failed` after
            // it. It carries no `id:`, so a client that saw it but not `response.failed` resumes
            // before both (the SSE last event id stays at the event before) and loses neither.
            if rendered.kind == "error" {
                frame
            } else {
                frame.id(rendered.sequence_number.to_string())
            }
        });
    respond(frames, stopping)
}

/// The chat rendering: `data: <chat.completion.chunk>` frames, ending with `data: [DONE]`.
pub fn chat_stream(
    events: BoxStream<'static, Event>,
    renderer: ChunkRenderer,
    stopping: impl std::future::Future<Output = ()> + Send + 'static,
) -> Response {
    let frames = events
        .scan(renderer, |renderer, event| {
            let rendered = renderer.render(&event);
            std::future::ready(Some(stream::iter(rendered)))
        })
        .flatten()
        .map(|chunk| match chunk {
            Chunk::Data(data) => SseEvent::default().data(json_frame(&data)),
            Chunk::Done => SseEvent::default().data("[DONE]"),
        });
    respond(frames, stopping)
}
