//! Tools, structured outputs and sampling controls end to end on the reference engine
//! (docs/tools-and-structured-outputs.md): function calls on Responses and Chat, streamed and
//! resumed, a JSON schema's smallest instance, stop strings, log probabilities, a kill -9 in the
//! middle of a call's arguments, and the bad input that is a 400 naming its field with nothing
//! created.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lmsp_tests as common;

use common::{assert_envelope, TestServer};
use serde_json::{json, Value};

fn weather_tool() -> Value {
    json!({"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "minLength": 3},
               "days": {"type": "integer", "minimum": 1}},
           "required": ["city", "days"], "additionalProperties": false},
           "strict": true})
}

fn chat_weather_tool() -> Value {
    let tool = weather_tool();
    json!({"type": "function", "function": {"name": tool["name"], "description":
        tool["description"], "parameters": tool["parameters"], "strict": true}})
}

/// The reference engine's arguments for `weather_tool`: its parameters' smallest instance.
const WEATHER_ARGUMENTS: &str = r#"{"city":"aaa","days":1}"#;

fn message_text(response: &Value) -> String {
    response["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|item| item["type"] == "message")
        .flat_map(|item| item["content"].as_array().unwrap().clone())
        .map(|part| part["text"].as_str().unwrap().to_owned())
        .collect()
}

/// A Responses tool loop: the required call comes back as a `function_call` item (ids `fc_…`,
/// `call_…`, arguments valid for the parameters), and the call's output sent back through
/// `previous_response_id` gets a text answer; a `function_call_output` naming no call is a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responses_tool_loop_calls_the_function_then_answers_with_text() {
    let server = TestServer::start(&[]);
    let (status, _, first) = server
        .post(
            "/v1/responses",
            json!({"model": "reference", "input": "What is the weather in Paris?",
                   "tools": [weather_tool()], "tool_choice": "required", "seed": 1}),
        )
        .await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["status"], "completed");
    let output = first["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{first}");
    let call = &output[0];
    assert_eq!(call["type"], "function_call");
    assert_eq!(call["name"], "get_weather");
    assert_eq!(call["status"], "completed");
    assert_eq!(call["arguments"], WEATHER_ARGUMENTS);
    assert!(call["id"].as_str().unwrap().starts_with("fc_"));
    let call_id = call["call_id"].as_str().unwrap();
    assert!(call_id.starts_with("call_"));
    assert_eq!(first["tool_choice"], "required");
    assert_eq!(first["tools"][0]["name"], "get_weather");

    let (status, _, second) = server
        .post(
            "/v1/responses",
            json!({"model": "reference", "previous_response_id": first["id"],
                   "input": [{"type": "function_call_output", "call_id": call_id,
                              "output": "{\"temperature\": 21}"}],
                   "tools": [weather_tool()], "max_output_tokens": 8, "seed": 1}),
        )
        .await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["output"][0]["type"], "message", "{second}");
    assert!(!message_text(&second).is_empty());

    let before = server.task_count().await;
    let (status, _, body) = server
        .post(
            "/v1/responses",
            json!({"model": "reference", "previous_response_id": first["id"],
                   "input": [{"type": "function_call_output", "call_id": "call_nobody",
                              "output": "x"}]}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_envelope(status, &body, "invalid_request", "unmatched call id");
    assert_eq!(body["error"]["param"], "input[0].call_id", "{body}");
    assert_eq!(server.task_count().await, before, "nothing is created");
}

/// The stream of a call: `response.output_item.added` of a `function_call`,
/// `response.function_call_arguments.delta`s that join to the arguments,
/// `response.function_call_arguments.done` and `response.output_item.done`; a stream resumed
/// after any of them gives exactly the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calls_stream_events_join_to_its_arguments_and_resume_exactly() {
    let server = TestServer::start(&[]);
    let response = server
        .submit_response(json!({"model": "reference", "input": "Weather?",
            "tools": [weather_tool()], "tool_choice": {"type": "function", "name": "get_weather"},
            "seed": 2}))
        .await;
    let id = response["id"].as_str().unwrap();
    server
        .wait_status(response["task_id"].as_str().unwrap(), "completed")
        .await;
    let all = server
        .sse(&format!("/v1/responses/{id}?stream=true"), None)
        .await
        .collect_all()
        .await;
    let data: Vec<Value> = all.iter().map(|m| m.data.clone()).collect();
    let kinds: Vec<&str> = data.iter().map(|d| d["type"].as_str().unwrap()).collect();
    let added = data
        .iter()
        .find(|d| d["type"] == "response.output_item.added")
        .unwrap();
    assert_eq!(added["item"]["type"], "function_call", "{kinds:?}");
    assert_eq!(added["item"]["status"], "in_progress");
    let arguments: String = data
        .iter()
        .filter(|d| d["type"] == "response.function_call_arguments.delta")
        .map(|d| d["delta"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(arguments, WEATHER_ARGUMENTS);
    let done = data
        .iter()
        .find(|d| d["type"] == "response.function_call_arguments.done")
        .unwrap();
    assert_eq!(done["arguments"], WEATHER_ARGUMENTS);
    assert_eq!(done["name"], "get_weather");
    assert_eq!(done["item_id"], added["item"]["id"]);
    let item_done = data
        .iter()
        .find(|d| d["type"] == "response.output_item.done")
        .unwrap();
    assert_eq!(item_done["item"]["arguments"], WEATHER_ARGUMENTS);
    assert_eq!(kinds.last(), Some(&"response.completed"));
    let completed = data.last().unwrap();
    assert_eq!(completed["response"]["output"][0]["type"], "function_call");

    for (index, message) in all.iter().enumerate() {
        let rest = server
            .sse(
                &format!("/v1/responses/{id}?stream=true"),
                Some(message.seq()),
            )
            .await
            .collect_all()
            .await;
        let expected: Vec<&str> = all[index + 1..].iter().map(|m| m.raw.as_str()).collect();
        let got: Vec<&str> = rest.iter().map(|m| m.raw.as_str()).collect();
        assert_eq!(got, expected, "resumed after {}", message.seq());
    }
}

/// Chat: `tool_calls` with `finish_reason: "tool_calls"`, the stream's
/// `delta.tool_calls[0].function.arguments` joined equal to them, and a `tool` message answering
/// the call gets text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_tool_loop_returns_tool_calls_then_text() {
    let server = TestServer::start(&[]);
    let messages = json!([{"role": "user", "content": "Weather in Paris?"}]);
    let body = json!({"model": "reference", "messages": messages, "tools": [chat_weather_tool()],
                      "tool_choice": "auto", "seed": 3});
    let (status, _, completion) = server.post("/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 200, "{completion}");
    let choice = &completion["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{completion}");
    assert!(choice["message"]["content"].is_null());
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    assert_eq!(call["function"]["arguments"], WEATHER_ARGUMENTS);

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let reply = server
        .http
        .post(server.url("/v1/chat/completions"))
        .bearer_auth(&server.admin_token)
        .json(&streamed)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status().as_u16(), 200);
    let text = reply.text().await.unwrap();
    let chunks: Vec<Value> = text
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).unwrap())
        .collect();
    let arguments: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str())
        .collect();
    assert_eq!(arguments, WEATHER_ARGUMENTS);
    let first_call = chunks
        .iter()
        .find(|c| c["choices"][0]["delta"]["tool_calls"].is_array())
        .unwrap();
    // Another task: another call id, of the same shape.
    let streamed_id = first_call["choices"][0]["delta"]["tool_calls"][0]["id"]
        .as_str()
        .unwrap();
    assert!(streamed_id.starts_with("call_"), "{streamed_id}");
    assert_ne!(call["id"], streamed_id);
    let finishes: Vec<&Value> = chunks
        .iter()
        .map(|c| &c["choices"][0]["finish_reason"])
        .filter(|f| f.is_string())
        .collect();
    assert_eq!(finishes, [&json!("tool_calls")]);

    let answer = json!({"model": "reference", "max_completion_tokens": 6, "seed": 3,
        "tools": [chat_weather_tool()], "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            choice["message"],
            {"role": "tool", "tool_call_id": call["id"], "content": "21 degrees"}]});
    let (status, _, completion) = server.post("/v1/chat/completions", answer).await;
    assert_eq!(status, 200, "{completion}");
    assert_ne!(completion["choices"][0]["finish_reason"], "tool_calls");
    assert!(completion["choices"][0]["message"]["content"].is_string());
}

/// Structured outputs: `text.format` json_schema and Chat's `response_format` give the schema's
/// smallest valid instance as the text; `json_object` gives `{}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_schema_format_answers_with_a_valid_instance() {
    let server = TestServer::start(&[]);
    let schema = json!({"type": "object", "properties": {"name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
        "score": {"type": "number", "minimum": 0.5}}, "required": ["name", "tags", "score"],
        "additionalProperties": false});
    let (status, _, response) = server
        .post(
            "/v1/responses",
            json!({"model": "reference", "input": "Describe a person",
                   "text": {"format": {"type": "json_schema", "name": "person", "schema": schema,
                                       "strict": true}}}),
        )
        .await;
    assert_eq!(status, 200, "{response}");
    let parsed: Value = serde_json::from_str(response["output_text"].as_str().unwrap()).unwrap();
    assert_eq!(parsed, json!({"name": "", "tags": ["", ""], "score": 0.5}));
    assert_eq!(response["text"]["format"]["type"], "json_schema");

    let (status, _, completion) = server
        .post(
            "/v1/chat/completions",
            json!({"model": "reference", "messages": [{"role": "user", "content": "x"}],
                   "response_format": {"type": "json_schema", "json_schema": {"name": "person",
                       "schema": schema, "strict": true}}}),
        )
        .await;
    assert_eq!(status, 200, "{completion}");
    let content = completion["choices"][0]["message"]["content"]
        .as_str()
        .unwrap();
    assert_eq!(serde_json::from_str::<Value>(content).unwrap(), parsed);

    let (status, _, object) = server
        .post(
            "/v1/chat/completions",
            json!({"model": "reference", "messages": [{"role": "user", "content": "x"}],
                   "response_format": {"type": "json_object"}}),
        )
        .await;
    assert_eq!(status, 200, "{object}");
    assert_eq!(object["choices"][0]["message"]["content"], "{}");
}

/// `stop`: the text ends before the first stop string, which is not returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_text_ends_before_the_first_stop_string() {
    let server = TestServer::start(&[]);
    let body = json!({"model": "reference", "messages": [{"role": "user", "content": "Tell"}],
                      "max_completion_tokens": 12, "seed": 9});
    let (_, _, full) = server.post("/v1/chat/completions", body.clone()).await;
    let text = full["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let words: Vec<&str> = text.split_whitespace().collect();
    assert!(words.len() > 4, "{text}");
    let stop = format!(" {} ", words[3]);
    let cut = text.find(&stop).unwrap();
    let mut stopped = body.clone();
    stopped["stop"] = json!([stop, "never-generated-string"]);
    let (status, _, completion) = server.post("/v1/chat/completions", stopped).await;
    assert_eq!(status, 200, "{completion}");
    assert_eq!(completion["choices"][0]["message"]["content"], &text[..cut]);
    // The generation ended at the word that completed the stop string (each word is a token):
    // fewer tokens than the budget, and finish_reason `stop`, as the unstopped run's is `length`.
    assert_eq!(full["choices"][0]["finish_reason"], "length");
    assert_eq!(full["usage"]["completion_tokens"], 12);
    let words_to_stop = text[..cut + stop.len()].split_whitespace().count();
    assert!(words_to_stop < 12, "{text}");
    assert_eq!(
        completion["choices"][0]["finish_reason"], "stop",
        "{completion}"
    );
    assert_eq!(
        completion["usage"]["completion_tokens"], words_to_stop,
        "{completion}"
    );
}

/// The reference engine answers every schema keyword it takes with a valid instance
/// (`multipleOf`, `minProperties`, `uniqueItems`, …) and refuses the ones it cannot build for
/// with a 400 naming the keyword, before anything is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_engine_builds_valid_instances_or_refuses_the_keyword() {
    let server = TestServer::start(&[]);
    let schema = json!({"type": "object", "properties": {
        "n": {"type": "integer", "multipleOf": 7, "minimum": 1},
        "o": {"type": "object", "minProperties": 1},
        "u": {"type": "array", "items": {"enum": [1, 2]}, "minItems": 2, "uniqueItems": true}},
        "required": ["n", "o", "u"]});
    let (status, _, response) = server
        .post(
            "/v1/responses",
            json!({"model": "reference", "input": "x",
                   "text": {"format": {"type": "json_schema", "name": "s", "schema": schema}}}),
        )
        .await;
    assert_eq!(status, 200, "{response}");
    let parsed: Value = serde_json::from_str(response["output_text"].as_str().unwrap()).unwrap();
    assert_eq!(
        parsed,
        json!({"n": 7, "o": {"property0": null}, "u": [1, 2]})
    );
    let cases = [
        (
            json!({"model": "reference", "input": "x", "text": {"format": {"type": "json_schema",
                   "name": "s", "schema": {"type": "object", "properties": {
                       "a": {"type": "string", "pattern": "^a+$"}}, "required": ["a"]}}}}),
            "text.format.schema.properties.a.pattern",
        ),
        (
            json!({"model": "reference", "input": "x", "text": {"format": {"type": "json_schema",
                   "name": "s", "schema": {"type": "object", "properties": {
                       "a": {"type": "integer", "minimum": 5, "maximum": 1}},
                       "required": ["a"]}}}}),
            "text.format.schema.properties.a.minimum",
        ),
        (
            json!({"model": "reference", "input": "x", "tool_choice": "required",
                   "tools": [{"type": "function", "name": "f", "parameters": {"type": "object",
                       "properties": {"n": {"type": "integer", "multipleOf": 7, "maximum": 6,
                           "minimum": 1}}, "required": ["n"]}}]}),
            "tools[0].parameters.properties.n.multipleOf",
        ),
    ];
    for (body, param) in cases {
        let (status, _, reply) = server.post("/v1/responses", body.clone()).await;
        assert_eq!(status, 400, "{body}: {reply}");
        assert_envelope(status, &reply, "invalid_request", param);
        assert_eq!(reply["error"]["param"], param, "{body}: {reply}");
    }
    assert_eq!(
        server.task_count().await,
        1,
        "only the valid request created a task"
    );
}

/// Log probabilities: Chat's `logprobs` + `top_logprobs` on each streamed chunk, Responses'
/// `include: ["message.output_text.logprobs"]` on each `response.output_text.delta`, and in the
/// native log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_probabilities_come_with_each_delta_when_asked_for() {
    let server = TestServer::start(&[]);
    let response = server
        .submit_response(json!({"model": "reference", "input": "Once upon a time",
            "max_output_tokens": 5, "seed": 4, "include": ["message.output_text.logprobs"],
            "top_logprobs": 2}))
        .await;
    let task = response["task_id"].as_str().unwrap();
    server.wait_status(task, "completed").await;
    let deltas: Vec<Value> = server
        .all_events(task)
        .await
        .into_iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .collect();
    assert_eq!(deltas.len(), 5);
    for delta in &deltas {
        let logprobs = delta["data"]["logprobs"].as_array().unwrap();
        assert_eq!(logprobs.len(), 1, "{delta}");
        assert_eq!(logprobs[0]["token"], delta["data"]["delta"]);
        assert!(logprobs[0]["logprob"].as_f64().unwrap() <= 0.0);
        assert!(logprobs[0]["top_logprobs"].as_array().unwrap().len() <= 2);
    }
    let id = response["id"].as_str().unwrap();
    let stream = server
        .sse(&format!("/v1/responses/{id}?stream=true"), None)
        .await
        .collect_all()
        .await;
    let with_logprobs = stream
        .iter()
        .map(|m| m.data.clone())
        .filter(|d| d["type"] == "response.output_text.delta")
        .filter(|d| d["logprobs"].as_array().is_some_and(|l| l.len() == 1))
        .count();
    assert_eq!(with_logprobs, 5);

    let reply = server
        .http
        .post(server.url("/v1/chat/completions"))
        .bearer_auth(&server.admin_token)
        .json(
            &json!({"model": "reference", "messages": [{"role": "user", "content": "x"}],
                      "max_completion_tokens": 4, "logprobs": true, "top_logprobs": 1,
                      "stream": true}),
        )
        .send()
        .await
        .unwrap();
    let text = reply.text().await.unwrap();
    let contents: Vec<Value> = text
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str::<Value>(data).unwrap())
        .filter_map(|chunk| {
            chunk["choices"][0]["logprobs"]["content"]
                .as_array()
                .cloned()
        })
        .flatten()
        .collect();
    assert_eq!(contents.len(), 4, "{text}");
}

/// I-6 for calls: a `resume` task killed in the middle of its call's arguments continues them
/// exactly, and the call's arguments are the same as an uninterrupted run's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_task_killed_inside_a_calls_arguments_continues_them_exactly_i6() {
    let mut server = TestServer::start(&["--reference-token-delay", "150ms"]);
    let tool = json!({"type": "function", "name": "fill",
        "parameters": {"type": "object", "properties": {
            "text": {"type": "string", "minLength": 40}}, "required": ["text"]}});
    let response = server
        .submit_response(
            json!({"model": "reference", "input": "Fill it", "tools": [tool],
            "tool_choice": "required", "on_restart": "resume", "seed": 5}),
        )
        .await;
    let task = response["task_id"].as_str().unwrap().to_owned();
    server
        .wait_task(&task, "inside the arguments", |t| {
            t["last_sequence_number"].as_u64().unwrap_or(0) >= 8
        })
        .await;
    server.kill_and_restart(&["--reference-token-delay", "1ms"]);
    let done = server.wait_status(&task, "completed").await;
    let events = server.all_events(&task).await;
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"response.resumed"), "{kinds:?}");
    let arguments: String = events
        .iter()
        .filter(|e| e["type"] == "response.function_call_arguments.delta")
        .map(|e| e["data"]["delta"].as_str().unwrap().to_owned())
        .collect();
    let expected = format!(r#"{{"text":"{}"}}"#, "a".repeat(40));
    assert_eq!(arguments, expected, "{kinds:?}");
    let (_, response) = server
        .get(&format!(
            "/v1/responses/{}",
            response["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(
        response["output"][0]["arguments"],
        expected.as_str(),
        "{done}"
    );
}

/// I-9: each bad request is a 400 naming its field or keyword, and creates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tools_formats_and_sampling_controls_are_refused_naming_the_field_i9() {
    let server = TestServer::start(&[]);
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "/v1/responses",
            json!({"model": "reference", "input": "x", "tools": [{"type": "web_search"}]}),
            "tools[0].type",
        ),
        (
            "/v1/responses",
            json!({"model": "reference", "input": "x", "tools": [{"type": "file_search",
                   "vector_store_ids": []}]}),
            "tools[0].type",
        ),
        (
            "/v1/responses",
            json!({"model": "reference", "input": "x", "tools": [weather_tool()],
                   "tool_choice": {"type": "function", "name": "other"}}),
            "tool_choice",
        ),
        (
            "/v1/responses",
            json!({"model": "reference", "input": "x", "text": {"format": {"type": "json_schema",
                   "name": "s", "schema": {"type": "object", "properties": {"a": {"type": "strin"}}}}}}),
            "text.format.schema.properties.a.type",
        ),
        (
            "/v1/responses",
            json!({"model": "reference", "input": [{"type": "function_call_output",
                   "call_id": "call_x", "output": "y"}]}),
            "input[0].call_id",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "reference", "messages": [{"role": "user", "content": "x"}], "n": 2}),
            "n",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "reference", "messages": [{"role": "user", "content": "x"}],
                   "stop": ["a", "b", "c", "d", "e"]}),
            "stop",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "reference", "messages": [{"role": "user", "content": "x"}],
                   "presence_penalty": 2.5}),
            "presence_penalty",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "reference", "messages": [{"role": "user", "content": "x"}],
                   "logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "reference", "messages": [{"role": "user", "content": "x"}],
                   "response_format": {"type": "json_schema", "json_schema": {"name": "s",
                       "schema": {"type": "object", "colour": "red"}}}}),
            "response_format.json_schema.schema.colour",
        ),
    ];
    for (path, body, param) in cases {
        let (status, _, reply) = server.post(path, body.clone()).await;
        assert_eq!(status, 400, "{body}: {reply}");
        assert_envelope(status, &reply, "invalid_request", param);
        assert_eq!(reply["error"]["param"], param, "{body}: {reply}");
    }
    assert_eq!(server.task_count().await, 0, "nothing was created");
}
