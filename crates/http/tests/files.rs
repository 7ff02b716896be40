//! `/v1/files` end to end, over the router and a real service (SQLite in a temp dir, the
//! reference engine): the list's orders and pages as OpenAI's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use serde_json::Value;

mod support;
use support::{request, send, test_app, Reply, TestApp};

const BOUNDARY: &str = "lmsp-test-boundary";

/// A multipart body of `parts` (`name`, optional filename, bytes), in order.
fn multipart(parts: &[(&str, Option<&str>, &[u8])]) -> Vec<u8> {
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
        created.push(reply.body["id"].as_str().unwrap().to_owned());
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
