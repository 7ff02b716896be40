//! `/v1/files` end to end, over the router and a real service (SQLite in a temp dir, the
//! reference engine): the list's orders and pages as OpenAI's; an upload refused, broken off
//! or given up on keeps nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use bytes::Bytes;
use futures::StreamExt;
use serde_json::Value;
use tower::ServiceExt;

mod support;
use support::{request, send, test_app, test_app_configured, Reply, TestApp};

const BOUNDARY: &str = "lmsp-test-boundary";

/// A part of a form: its name, its filename if it has one, its bytes.
type Part<'a> = (&'a str, Option<&'a str>, &'a [u8]);

/// A multipart body of `parts`, in order.
fn multipart(parts: &[Part]) -> Vec<u8> {
    let mut body = Vec::new();
    for (name, filename, bytes) in parts {
        body.extend_from_slice(format!("--{BOUNDARY}\r\n").as_bytes());
        let disposition = match filename {
            Some(filename) => {
                format!(
                    "Content-Disposition: form-data; name=\"{name}\"; filename=\"{filename}\"\r\n"
                )
            }
            None => format!("Content-Disposition: form-data; name=\"{name}\"\r\n"),
        };
        body.extend_from_slice(disposition.as_bytes());
        body.extend_from_slice(b"\r\n");
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    body
}

/// `POST /v1/files` with `body` as the admin.
fn upload_request(app: &TestApp, body: Body) -> Request<Body> {
    Request::builder()
        .method(Method::POST)
        .uri("/v1/files")
        .header(header::AUTHORIZATION, format!("Bearer {}", app.admin_token))
        .header(
            header::CONTENT_TYPE,
            format!("multipart/form-data; boundary={BOUNDARY}"),
        )
        .body(body)
        .unwrap()
}

/// Uploads `bytes` as a batch file; its file object.
async fn upload(app: &TestApp, bytes: &[u8]) -> Value {
    let body = multipart(&[
        ("purpose", None, b"batch"),
        ("file", Some("requests.jsonl"), bytes),
    ]);
    let reply = send(&app.router, upload_request(app, Body::from(body))).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.body
}

/// Creates a `/v1/responses` batch of the uploaded `file`; the batch object.
async fn create_batch(app: &TestApp, file: &Value) -> Value {
    let body = serde_json::json!({
        "input_file_id": file["id"],
        "endpoint": "/v1/responses",
        "completion_window": "24h",
    });
    let reply = send(
        &app.router,
        request(
            Method::POST,
            "/v1/batches",
            Some(&app.admin_token),
            Some(body),
        ),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.body
}

async fn get(app: &TestApp, path: &str) -> Reply {
    send(
        &app.router,
        request(Method::GET, path, Some(&app.admin_token), None),
    )
    .await
}

fn ids(list: &Value) -> Vec<String> {
    list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|file| file["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Every id of `path`'s list, following `has_more` with `after` = the page's last id.
async fn all_pages(app: &TestApp, path: &str) -> (Vec<String>, usize) {
    let (mut seen, mut pages, mut after) = (Vec::new(), 0, None::<String>);
    loop {
        let uri = match &after {
            Some(after) => format!("{path}&after={after}"),
            None => path.to_owned(),
        };
        let reply = get(app, &uri).await;
        assert_eq!(reply.status, StatusCode::OK, "{uri}: {}", reply.body);
        let page = ids(&reply.body);
        pages += 1;
        after = page.last().cloned();
        seen.extend(page);
        if reply.body["has_more"] != Value::Bool(true) {
            return (seen, pages);
        }
    }
}

#[tokio::test]
async fn files_are_listed_newest_first_by_default_or_oldest_first_and_paged_in_that_order() {
    let app = test_app().await;
    let mut uploaded = Vec::new();
    for n in 0..3 {
        let file = upload(&app, format!("line {n}\n").as_bytes()).await;
        uploaded.push(file["id"].as_str().unwrap().to_owned());
    }
    let newest_first: Vec<String> = uploaded.iter().rev().cloned().collect();

    let listed = get(&app, "/v1/files").await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    assert_eq!(ids(&listed.body), newest_first, "desc is the default");
    let desc = get(&app, "/v1/files?order=desc").await;
    assert_eq!(ids(&desc.body), newest_first);
    let asc = get(&app, "/v1/files?order=asc").await;
    assert_eq!(ids(&asc.body), uploaded);

    assert_eq!(
        all_pages(&app, "/v1/files?order=desc&limit=2").await,
        (newest_first.clone(), 2)
    );
    assert_eq!(
        all_pages(&app, "/v1/files?order=asc&limit=2").await,
        (uploaded.clone(), 2)
    );
    assert_eq!(
        all_pages(&app, "/v1/files?limit=1").await,
        (newest_first, 3),
        "the default order pages newest first"
    );

    let page = get(&app, "/v1/files?order=asc&limit=2").await;
    assert_eq!(page.body["first_id"], uploaded[0].as_str(), "{}", page.body);
    assert_eq!(page.body["last_id"], uploaded[1].as_str(), "{}", page.body);
    let newest = get(&app, "/v1/files?limit=1").await;
    assert_eq!(newest.body["first_id"], uploaded[2].as_str());
    assert_eq!(newest.body["last_id"], uploaded[2].as_str());
    let past_the_end = get(&app, &format!("/v1/files?order=asc&after={}", uploaded[2])).await;
    assert_eq!(ids(&past_the_end.body), Vec::<String>::new());
    assert_eq!(past_the_end.body["first_id"], Value::Null);
    assert_eq!(past_the_end.body["last_id"], Value::Null);

    let refused = get(&app, "/v1/files?order=sideways").await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.body);
    assert_eq!(refused.body["error"]["param"], "order");
    assert_eq!(refused.body["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn the_batches_list_names_its_first_and_last_batch() {
    let app = test_app().await;
    let mut created = Vec::new();
    for _ in 0..3 {
        let file = upload(&app, b"{}\n").await;
        let batch = create_batch(&app, &file).await;
        created.push(batch["id"].as_str().unwrap().to_owned());
    }
    let listed = get(&app, "/v1/batches?limit=2").await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    assert_eq!(
        ids(&listed.body),
        vec![created[2].clone(), created[1].clone()]
    );
    assert_eq!(listed.body["first_id"], created[2].as_str());
    assert_eq!(listed.body["last_id"], created[1].as_str());
    assert_eq!(listed.body["has_more"], true);
    let rest = get(&app, &format!("/v1/batches?after={}", created[1])).await;
    assert_eq!(rest.body["first_id"], created[0].as_str());
    assert_eq!(rest.body["last_id"], created[0].as_str());
    assert_eq!(rest.body["has_more"], false);
}

/// The names in the data directory's `files/`.
fn stored_names(app: &TestApp) -> Vec<String> {
    std::fs::read_dir(app.data_dir.path().join("files"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// The start of an upload whose `file` part is still streaming: `purpose`, then the file's
/// first bytes.
fn upload_head() -> Bytes {
    let mut head = format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
         --{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; \
         filename=\"requests.jsonl\"\r\n\r\n"
    )
    .into_bytes();
    head.extend_from_slice(&[b'x'; 64 * 1024]);
    Bytes::from(head)
}

#[tokio::test]
async fn an_upload_that_breaks_off_midway_leaves_no_file_behind() {
    let app = test_app().await;
    let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
        Ok(upload_head()),
        Err(std::io::Error::other("the connection was reset")),
    ];
    let reply = send(
        &app.router,
        upload_request(&app, Body::from_stream(futures::stream::iter(chunks))),
    )
    .await;
    assert!(
        reply.status.is_client_error(),
        "{}: {}",
        reply.status,
        reply.body
    );
    assert_eq!(stored_names(&app), Vec::<String>::new());
    assert_eq!(
        ids(&get(&app, "/v1/files").await.body),
        Vec::<String>::new()
    );
}

#[tokio::test]
async fn an_upload_its_client_gives_up_on_leaves_no_file_behind() {
    let app = test_app().await;
    // The head, then nothing more, ever: the client is gone and the request is dropped.
    let chunks = futures::stream::iter([Ok::<_, std::io::Error>(upload_head())])
        .chain(futures::stream::pending());
    let request = upload_request(&app, Body::from_stream(chunks));
    let router = app.router.clone();
    let upload = tokio::spawn(async move { router.oneshot(request).await });
    let mut waited = Duration::ZERO;
    while !stored_names(&app)
        .iter()
        .any(|name| name.ends_with(".part"))
    {
        assert!(waited < Duration::from_secs(10), "the upload never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
        waited += Duration::from_millis(10);
    }
    upload.abort();
    assert!(upload.await.unwrap_err().is_cancelled());
    assert_eq!(stored_names(&app), Vec::<String>::new());
}

#[tokio::test]
async fn an_upload_over_the_size_limit_is_refused_and_leaves_no_file_behind() {
    let app = test_app_configured(None, |settings| settings.max_file_bytes = 1024).await;
    for size in [1025, 200 * 1024] {
        let body = multipart(&[
            ("purpose", None, b"batch"),
            ("file", Some("requests.jsonl"), &vec![b'x'; size]),
        ]);
        let reply = send(&app.router, upload_request(&app, Body::from(body))).await;
        assert_eq!(
            reply.status,
            StatusCode::PAYLOAD_TOO_LARGE,
            "{}",
            reply.body
        );
        assert_eq!(stored_names(&app), Vec::<String>::new(), "{size} bytes");
    }
    let fits = upload(&app, &[b'x'; 1024]).await;
    assert_eq!(fits["bytes"], 1024);
    assert_eq!(
        stored_names(&app),
        vec![fits["id"].as_str().unwrap().to_owned()]
    );
}

#[tokio::test]
async fn a_form_part_other_than_file_and_purpose_is_refused_by_name_and_nothing_is_kept() {
    let app = test_app().await;
    let cases: [(&[Part], &str); 3] = [
        (
            &[
                ("foo", None, b"bar"),
                ("purpose", None, b"batch"),
                ("file", Some("requests.jsonl"), b"{}\n"),
            ],
            "foo",
        ),
        (
            &[
                ("purpose", None, b"batch"),
                ("file", Some("requests.jsonl"), b"{}\n"),
                ("expires_after[anchor]", None, b"created_at"),
                ("expires_after[seconds]", None, b"3600"),
            ],
            "expires_after[anchor]",
        ),
        (
            &[
                ("file", Some("requests.jsonl"), b"{}\n"),
                ("expires_after[seconds]", None, b"3600"),
                ("purpose", None, b"batch"),
            ],
            "expires_after[seconds]",
        ),
    ];
    for (parts, field) in cases {
        let reply = send(
            &app.router,
            upload_request(&app, Body::from(multipart(parts))),
        )
        .await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{field}: {}",
            reply.body
        );
        let error = &reply.body["error"];
        assert_eq!(error["param"], field, "{}", reply.body);
        assert_eq!(error["type"], "invalid_request_error");
        assert_eq!(error["code"], "invalid_request");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(field), "{message}");
        if field.starts_with("expires_after") {
            assert!(message.contains("not supported"), "{message}");
        }
    }
    assert_eq!(
        ids(&get(&app, "/v1/files").await.body),
        Vec::<String>::new()
    );
    assert_eq!(stored_names(&app), Vec::<String>::new());
}

#[tokio::test]
async fn a_batchs_output_file_expires_a_retention_after_the_batchs_end_and_an_upload_never() {
    let app = test_app().await;
    let line = serde_json::json!({
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/responses",
        "body": {"model": "reference", "input": "hello", "max_output_tokens": 4},
    });
    let input = upload(&app, format!("{line}\n").as_bytes()).await;
    assert_eq!(
        input["expires_at"],
        Value::Null,
        "an upload stays until deleted"
    );
    let created = create_batch(&app, &input).await;
    let path = format!("/v1/batches/{}", created["id"].as_str().unwrap());
    let mut waited = Duration::ZERO;
    let batch = loop {
        let batch = get(&app, &path).await.body;
        if batch["status"] == "completed" {
            break batch;
        }
        assert!(waited < Duration::from_secs(30), "not completed: {batch}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited += Duration::from_millis(20);
    };
    let retention = app.service.settings().retention.as_secs() as i64;
    let ended = batch["completed_at"].as_i64().unwrap();
    let output_id = batch["output_file_id"].as_str().unwrap();
    let output = get(&app, &format!("/v1/files/{output_id}")).await.body;
    assert_eq!(output["purpose"], "batch_output");
    assert_eq!(
        output["expires_at"],
        ended + retention,
        "{output} of {batch}"
    );
    let listed = get(&app, "/v1/files").await.body;
    let expiries: Vec<&Value> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|file| &file["expires_at"])
        .collect();
    assert_eq!(
        expiries,
        vec![&Value::from(ended + retention), &Value::Null],
        "{listed}"
    );
    let again = get(
        &app,
        &format!("/v1/files/{}", input["id"].as_str().unwrap()),
    )
    .await;
    assert_eq!(again.body["expires_at"], Value::Null);
}
