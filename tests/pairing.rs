//! Pairing and clients (docs/api.md): bad input to the pairing endpoints is refused with the
//! envelope and creates nothing; the client list never shows a secret.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lmsp_tests as common;

use common::{assert_envelope, TestServer};
use serde_json::{json, Value};

async fn client_count(server: &TestServer) -> usize {
    server.get("/v1/clients").await.1["data"]
        .as_array()
        .unwrap()
        .len()
}

/// I-9: each bad request to `/v1/pairings` or `/v1/pair` gets its 4xx and creates no code and no
/// client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_pairing_requests_are_refused_and_create_nothing_i9() {
    let server = TestServer::start(&[]);
    let reader = server.add_client("reader", &["responses:read"]);
    let before = client_count(&server).await;
    let admin = server.admin_token.clone();
    let pairings: Vec<(&str, &str, Value, u16, &str)> = vec![
        (
            "not an admin",
            reader.as_str(),
            json!({"scopes": ["responses:read"]}),
            403,
            "forbidden",
        ),
        ("no scopes", &admin, json!({}), 400, "invalid_request"),
        (
            "empty scopes",
            &admin,
            json!({"scopes": []}),
            400,
            "invalid_request",
        ),
        (
            "unknown scope",
            &admin,
            json!({"scopes": ["root"]}),
            400,
            "invalid_request",
        ),
        (
            "scopes not a list",
            &admin,
            json!({"scopes": "admin"}),
            400,
            "invalid_request",
        ),
        (
            "unknown field",
            &admin,
            json!({"scopes": ["admin"], "ttl": 5}),
            400,
            "invalid_request",
        ),
    ];
    for (name, token, body, status, code) in pairings {
        let (got, _, reply) = server.post_as(token, "/v1/pairings", body).await;
        assert_eq!(got, status, "{name}: {reply}");
        assert_envelope(got, &reply, code, name);
    }
    let (_, _, pairing) = server
        .post("/v1/pairings", json!({"scopes": ["responses:read"]}))
        .await;
    let code = pairing["code"].as_str().unwrap();
    let pair = |body: Value| server.http.post(server.url("/v1/pair")).json(&body).send();
    let pairs: Vec<(&str, Value, u16, &str)> = vec![
        (
            "no code",
            json!({"name": "x", "scopes": ["responses:read"]}),
            400,
            "invalid_request",
        ),
        (
            "code not a string",
            json!({"code": 483921, "name": "x", "scopes": ["responses:read"]}),
            400,
            "invalid_request",
        ),
        (
            "empty name",
            json!({"code": code, "name": "", "scopes": ["responses:read"]}),
            400,
            "invalid_request",
        ),
        (
            "unknown scope",
            json!({"code": code, "name": "x", "scopes": ["everything"]}),
            400,
            "invalid_request",
        ),
        (
            "unknown field",
            json!({"code": code, "name": "x", "scopes": ["responses:read"], "admin": true}),
            400,
            "invalid_request",
        ),
        (
            "a scope the code does not grant",
            json!({"code": code, "name": "x", "scopes": ["models:write"]}),
            403,
            "forbidden",
        ),
    ];
    for (name, body, status, code) in pairs {
        let response = pair(body).await.unwrap();
        let got = response.status().as_u16();
        let reply: Value = response.json().await.unwrap();
        assert_eq!(got, status, "{name}: {reply}");
        assert_envelope(got, &reply, code, name);
    }
    let unsupported = server
        .http
        .post(server.url("/v1/pair"))
        .body(json!({"code": code, "name": "x", "scopes": ["responses:read"]}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(unsupported.status().as_u16(), 415);
    let reply: Value = unsupported.json().await.unwrap();
    assert_envelope(415, &reply, "unsupported_media_type", "no content type");
    assert_eq!(client_count(&server).await, before, "no client was created");
    let paired = pair(json!({"code": code, "name": "phone", "scopes": ["responses:read"]}))
        .await
        .unwrap();
    assert_eq!(
        paired.status().as_u16(),
        201,
        "the code survived every refusal"
    );
    assert_eq!(client_count(&server).await, before + 1);
}

/// I-7: the client list shows ids, names, scopes and dates — never a token or a hash; deleting an
/// unknown or malformed client id is a 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_list_never_shows_a_secret_i7() {
    let server = TestServer::start(&[]);
    let token = server.add_client("laptop", &["responses:read", "responses:write"]);
    let (status, list) = server.get("/v1/clients").await;
    assert_eq!(status, 200);
    let text = list.to_string();
    assert!(
        !text.contains(token.trim_start_matches("lmsp_")),
        "a token in the list"
    );
    assert!(!text.contains(server.admin_token.trim_start_matches("lmsp_")));
    for client in list["data"].as_array().unwrap() {
        let mut fields: Vec<&str> = client
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        fields.sort_unstable();
        assert_eq!(
            fields,
            [
                "created_at",
                "id",
                "max_queued",
                "max_running",
                "name",
                "object",
                "revoked_at",
                "scopes"
            ]
        );
    }
    for id in ["cli_01ARZ3NDEKTSV4RRFFQ69G5FAV", "not-an-id", "cli_..%2F.."] {
        let response = server
            .request(
                reqwest::Method::DELETE,
                &format!("/v1/clients/{id}"),
                &server.admin_token,
            )
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 404, "{id}");
    }
}

/// docs/api.md: wrong codes sent all at once get no more than five 401s; the rest are 429 with
/// `Retry-After` (the limit holds under concurrency).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_wrong_codes_cannot_pass_the_limit() {
    let server = TestServer::start(&[]);
    let guesses = (0..64).map(|i| {
        server
            .http
            .post(server.url("/v1/pair"))
            .json(
                &json!({"code": format!("{i:03}-000"), "name": "x", "scopes": ["responses:read"]}),
            )
            .send()
    });
    let replies = futures::future::join_all(guesses).await;
    let mut statuses: Vec<u16> = Vec::new();
    for reply in replies {
        let reply = reply.unwrap();
        if reply.status().as_u16() == 429 {
            assert!(reply.headers().contains_key("retry-after"));
        }
        statuses.push(reply.status().as_u16());
    }
    let unauthorized = statuses.iter().filter(|s| **s == 401).count();
    assert!(
        unauthorized <= 5,
        "{unauthorized} wrong codes were checked: {statuses:?}"
    );
    assert_eq!(
        unauthorized + statuses.iter().filter(|s| **s == 429).count(),
        64
    );
}

/// docs/api.md: an admin's pairing code gives a new client a token once; wrong codes are 401, and
/// after five of them every outstanding code is burnt and pairing answers 429 with
/// `Retry-After`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pairing_gives_a_new_client_a_token_once_and_limits_wrong_codes() {
    let server = TestServer::start(&[]);
    let (status, _, pairing) = server
        .post(
            "/v1/pairings",
            json!({"scopes": ["responses:read", "responses:write"]}),
        )
        .await;
    assert_eq!(status, 201, "{pairing}");
    let code = pairing["code"].as_str().unwrap().to_owned();
    let digits: Vec<&str> = code.split('-').collect();
    assert!(
        digits.len() == 2
            && digits
                .iter()
                .all(|d| d.len() == 3 && d.bytes().all(|b| b.is_ascii_digit())),
        "a code like 483-921: {code}"
    );
    assert!(
        pairing["expires_at"].as_str().unwrap().ends_with('Z'),
        "{pairing}"
    );
    let pair = |body: Value| server.http.post(server.url("/v1/pair")).json(&body).send();
    let too_wide = pair(json!({"code": code, "name": "phone", "scopes": ["admin"]}))
        .await
        .unwrap();
    assert_eq!(too_wide.status().as_u16(), 403);
    let paired = pair(json!({"code": code, "name": "phone", "scopes": ["responses:read"]}))
        .await
        .unwrap();
    assert_eq!(paired.status().as_u16(), 201);
    let paired: Value = paired.json().await.unwrap();
    let token = paired["token"].as_str().unwrap();
    assert!(token.starts_with("lmsp_"), "{paired}");
    assert!(paired["client_id"].as_str().unwrap().starts_with("cli_"));
    assert_eq!(paired["scopes"], json!(["responses:read"]));
    assert_eq!(server.get_as(token, "/v1/tasks").await.0, 200);
    let (status, _, _) = server
        .post_as(
            token,
            "/v1/responses",
            json!({"model": "reference", "input": "x"}),
        )
        .await;
    assert_eq!(status, 403, "only the scopes asked for");
    let reused = pair(json!({"code": code, "name": "again", "scopes": ["responses:read"]}))
        .await
        .unwrap();
    assert_eq!(reused.status().as_u16(), 401, "a code works once");
    let (_, _, fresh) = server
        .post("/v1/pairings", json!({"scopes": ["responses:read"]}))
        .await;
    for _ in 0..4 {
        let wrong = pair(json!({"code": "000-000", "name": "x", "scopes": ["responses:read"]}))
            .await
            .unwrap();
        assert_eq!(wrong.status().as_u16(), 401);
        let body: Value = wrong.json().await.unwrap();
        assert_envelope(401, &body, "unauthorized", "a wrong code");
    }
    let limited = pair(json!({"code": fresh["code"], "name": "x", "scopes": ["responses:read"]}))
        .await
        .unwrap();
    assert_eq!(limited.status().as_u16(), 429, "after five wrong codes");
    assert!(limited.headers().contains_key("retry-after"));
    let body: Value = limited.json().await.unwrap();
    assert_envelope(429, &body, "rate_limited", "the limit");
}
