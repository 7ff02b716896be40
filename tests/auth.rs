//! Authentication and isolation end to end (the README, docs/api.md): scopes, a client's own tasks and
//! responses, and revocation that takes effect at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lmsp_tests as common;

use std::process::Command;

use common::{assert_envelope, lmsp_binary, TestServer};
use serde_json::{json, Value};

/// I-7: a client sees only its own tasks and responses; another's is a 404; a scope it lacks is
/// a 403; a revoked token stops at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_are_isolated_and_revocation_is_immediate_i7() {
    let server = TestServer::start(&[]);
    let alice = server.add_client("alice", &["responses:write", "responses:read"]);
    let bob = server.add_client("bob", &["responses:write", "responses:read"]);
    let reader = server.add_client("reader", &["responses:read"]);
    let (status, _, accepted) = server
        .post_as(
            &alice,
            "/v1/responses",
            json!({"model": "reference", "input": "hi", "background": true, "max_output_tokens": 3}),
        )
        .await;
    assert_eq!(status, 202, "{accepted}");
    let id = accepted["task_id"].as_str().unwrap();
    let response_id = accepted["id"].as_str().unwrap();
    assert_eq!(
        server.get_as(&alice, &format!("/v1/tasks/{id}")).await.0,
        200
    );
    assert_eq!(
        server
            .get_as(&alice, &format!("/v1/responses/{response_id}"))
            .await
            .0,
        200
    );
    let hidden = [
        format!("/v1/tasks/{id}"),
        format!("/v1/tasks/{id}/events"),
        format!("/v1/responses/{response_id}"),
        format!("/v1/responses/{response_id}?stream=true"),
    ];
    for path in &hidden {
        let (status, body) = server.get_as(&bob, path).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert_envelope(status, &body, "not_found", path);
    }
    for path in [
        format!("/v1/tasks/{id}/cancel"),
        format!("/v1/responses/{response_id}/cancel"),
    ] {
        let (status, _, body) = server.post_as(&bob, &path, Value::Null).await;
        assert_eq!(status, 404, "{path}: {body}");
    }
    let (status, _, body) = server
        .send(server.request(
            reqwest::Method::DELETE,
            &format!("/v1/responses/{response_id}"),
            &bob,
        ))
        .await;
    assert_eq!(status, 404, "{body}");
    let (_, bobs) = server.get_as(&bob, "/v1/tasks").await;
    assert_eq!(bobs["data"].as_array().unwrap().len(), 0);
    let (_, alices) = server.get_as(&alice, "/v1/tasks").await;
    assert_eq!(alices["data"].as_array().unwrap().len(), 1);
    assert_eq!(
        server.get(&format!("/v1/tasks/{id}")).await.0,
        200,
        "admin sees all"
    );
    let (status, _, body) = server
        .post_as(
            &reader,
            "/v1/responses",
            json!({"model": "reference", "input": "hi"}),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert_envelope(status, &body, "forbidden", "a reader writes");
    let (status, body) = server.get_as(&reader, "/v1/clients").await;
    assert_eq!(status, 403, "{body}");
    let (_, clients) = server.get("/v1/clients").await;
    let bob_id = clients["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "bob")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(!clients.to_string().contains("hash"));
    let (status, _, _) = server.delete(&format!("/v1/clients/{bob_id}")).await;
    assert_eq!(status, 204);
    let response = server
        .request(reqwest::Method::GET, "/v1/tasks", &bob)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 401);
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    let body: Value = response.json().await.unwrap();
    assert_envelope(401, &body, "unauthorized", "a revoked token");
    assert_eq!(
        server.get_as(&alice, "/v1/tasks").await.0,
        200,
        "others are untouched"
    );
}

/// the README, docs/api.md: a client added with `lmsp clients add` while the server runs works at once; one
/// revoked with `lmsp clients revoke` stops at once; `lmsp clients list` shows its state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offline_client_commands_take_effect_on_a_running_server_at_once() {
    let server = TestServer::start(&[]);
    let token = server.add_client("laptop", &["models:read"]);
    assert_eq!(server.get_as(&token, "/v1/models").await.0, 200);
    assert_eq!(
        server.get_as(&token, "/v1/tasks").await.0,
        403,
        "models:read only"
    );
    let cli = |args: &[&str]| {
        let output = Command::new(lmsp_binary())
            .args(args)
            .arg("--data-dir")
            .arg(&server.data_dir)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    };
    let listed = cli(&["clients", "list"]);
    let line = listed
        .lines()
        .find(|l| l.contains("laptop"))
        .unwrap_or_else(|| panic!("{listed}"));
    assert!(line.contains("active"), "{line}");
    assert!(!listed.contains(token.trim_start_matches("lmsp_")));
    let id = line.split('\t').next().unwrap().to_owned();
    assert!(id.starts_with("cli_"), "{line}");
    cli(&["clients", "revoke", &id]);
    assert_eq!(server.get_as(&token, "/v1/models").await.0, 401);
    let listed = cli(&["clients", "list"]);
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with(&id) && l.contains("revoked")),
        "{listed}"
    );
    let (_, clients) = server.get("/v1/clients").await;
    let laptop = clients["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id.as_str())
        .unwrap()
        .clone();
    assert!(laptop["revoked_at"].is_string(), "{laptop}");
}
