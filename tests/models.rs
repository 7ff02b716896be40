//! Models (docs/api.md, P-1): registration with a streamed digest inside `--models-dir`, the
//! metadata endpoints, the digest check at load, startup registration and the offline CLI.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lmsp_tests as common;

use std::path::Path;
use std::process::Command;

use common::{assert_envelope, lmsp_binary, prompt, TestServer};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

fn sha256_of(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

fn models_dir(server: &TestServer) -> std::path::PathBuf {
    server.data_dir.join("models")
}

/// A small corpus the reference engine can generate from.
const CORPUS: &str = "the quick brown fox jumps over the lazy dog and the dog sleeps in the sun \
                      while the fox runs into the forest and the birds sing over the river";

async fn register(server: &TestServer, id: &str, path: &Path) -> (u16, Value) {
    let (status, _, body) = server
        .post(
            "/v1/models",
            json!({"id": id, "path": path.to_string_lossy()}),
        )
        .await;
    (status, body)
}

/// P-1: a registered model is metadata only — canonical path, size, the file's streamed SHA-256 —
/// readable through the API; deleting it leaves the user's file untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_file_is_registered_with_its_digest_and_deleted_without_touching_it_p1() {
    let server = TestServer::start(&[]);
    let path = models_dir(&server).join("story.gguf");
    std::fs::write(&path, CORPUS).unwrap();
    let (status, model) = register(&server, "story", &path).await;
    assert_eq!(status, 201, "{model}");
    assert_eq!(model["object"], "model");
    assert_eq!(model["id"], "story");
    assert_eq!(model["format"], "gguf");
    assert_eq!(model["size_bytes"], CORPUS.len());
    assert_eq!(model["digest"], sha256_of(CORPUS.as_bytes()));
    // The path is stored relative to `--models-dir` (where every instance finds its own copy),
    // and resolves to the file.
    let stored = model["path"].as_str().unwrap();
    assert_eq!(stored, "story.gguf", "{model}");
    assert_eq!(
        std::fs::canonicalize(models_dir(&server).join(stored)).unwrap(),
        std::fs::canonicalize(&path).unwrap()
    );
    assert!(model["created_at"].as_str().unwrap().ends_with('Z'));
    assert!(model["created"].is_i64(), "OpenAI's Unix seconds: {model}");
    assert!(model["owned_by"].is_string(), "{model}");

    assert_eq!(server.get("/v1/models/story").await, (200, model.clone()));
    // docs/openai-sdk.md: `path` only for `admin` and `models:write`.
    let reader = server.add_client("reader", &["models:read"]);
    let (status, seen) = server.get_as(&reader, "/v1/models/story").await;
    assert_eq!(status, 200, "{seen}");
    assert!(seen.get("path").is_none(), "{seen}");
    assert_eq!(seen["digest"], model["digest"]);
    let (_, listed) = server.get_as(&reader, "/v1/models").await;
    assert!(
        listed["data"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m.get("path").is_none()),
        "{listed}"
    );
    let (_, list) = server.get("/v1/models").await;
    assert_eq!(list["object"], "list");
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["reference", "story"]);

    let (again, body) = register(&server, "story", &path).await;
    assert_eq!(again, 409, "an existing id");
    assert_envelope(again, &body, "already_exists", "an existing id");

    let deleted = server
        .request(
            reqwest::Method::DELETE,
            "/v1/models/story",
            &server.admin_token,
        )
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status().as_u16(), 204);
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        CORPUS,
        "P-1: file untouched"
    );
    let (status, body) = server.get("/v1/models/story").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    let gone = server
        .request(
            reqwest::Method::DELETE,
            "/v1/models/story",
            &server.admin_token,
        )
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status().as_u16(), 404);
}

/// I-9: every bad registration is a 400/403/404/409 with the envelope and registers nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_model_registrations_are_rejected_and_register_nothing_i9() {
    let server = TestServer::start(&[]);
    let dir = models_dir(&server);
    let outside = server.data_dir.join("outside.bin");
    std::fs::write(&outside, b"secret").unwrap();
    std::os::unix::fs::symlink(&outside, dir.join("escape.bin")).unwrap();
    std::fs::create_dir(dir.join("folder")).unwrap();
    let reader = server.add_client("reader", &["models:read"]);
    let rows: Vec<(&str, Value, &str, u16, &str)> = vec![
        (
            "traversal",
            json!({"id": "a", "path": "../outside.bin"}),
            "admin",
            400,
            "invalid_request",
        ),
        (
            "absolute outside",
            json!({"id": "a", "path": outside.to_string_lossy()}),
            "admin",
            400,
            "invalid_request",
        ),
        (
            "link escaping the directory",
            json!({"id": "a", "path": dir.join("escape.bin").to_string_lossy()}),
            "admin",
            400,
            "invalid_request",
        ),
        (
            "a directory",
            json!({"id": "a", "path": dir.join("folder").to_string_lossy()}),
            "admin",
            400,
            "invalid_request",
        ),
        (
            "a missing file",
            json!({"id": "a", "path": dir.join("nothing.bin").to_string_lossy()}),
            "admin",
            400,
            "invalid_request",
        ),
        (
            "the device /dev/zero",
            json!({"id": "a", "path": "/dev/zero"}),
            "admin",
            400,
            "invalid_request",
        ),
        (
            "a bad id",
            json!({"id": "../x", "path": "reference.txt"}),
            "admin",
            400,
            "invalid_request",
        ),
        (
            "no path",
            json!({"id": "a"}),
            "admin",
            400,
            "invalid_request",
        ),
        (
            "a path of the wrong type",
            json!({"id": "a", "path": 7}),
            "admin",
            400,
            "invalid_request",
        ),
        (
            "an unknown field",
            json!({"id": "a", "path": "reference.txt", "x": 1}),
            "admin",
            400,
            "invalid_request",
        ),
        (
            "an existing id",
            json!({"id": "reference", "path": "reference.txt"}),
            "admin",
            409,
            "already_exists",
        ),
        (
            "without models:write",
            json!({"id": "a", "path": "reference.txt"}),
            "reader",
            403,
            "forbidden",
        ),
    ];
    for (name, body, who, status, code) in rows {
        let token = if who == "reader" {
            reader.clone()
        } else {
            server.admin_token.clone()
        };
        let (got, _, reply) = server.post_as(&token, "/v1/models", body).await;
        assert_eq!(got, status, "{name}: {reply}");
        assert_envelope(got, &reply, code, name);
    }
    let (status, body) = server.get("/v1/models/not-there").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    let (_, list) = server.get("/v1/models").await;
    assert_eq!(
        list["data"].as_array().unwrap().len(),
        1,
        "only the reference model: {list}"
    );
    assert_eq!(std::fs::read(&outside).unwrap(), b"secret");
}

/// docs/api.md: a task on a model whose file changed fails with `model_digest_mismatch`; one whose
/// file is gone fails with `model_unavailable`; the file is re-hashed only when it changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_or_missing_model_file_fails_the_task_with_its_code() {
    let server = TestServer::start(&[]);
    let dir = models_dir(&server);
    let changed = dir.join("changed.txt");
    let missing = dir.join("missing.txt");
    for path in [&changed, &missing] {
        std::fs::write(path, CORPUS).unwrap();
    }
    assert_eq!(register(&server, "changed", &changed).await.0, 201);
    assert_eq!(register(&server, "missing", &missing).await.0, 201);
    let ok = server
        .submit(json!({"model": "changed", "input": "the fox", "max_output_tokens": 5}))
        .await;
    server.wait_status(&ok, "completed").await;

    std::fs::write(&changed, CORPUS.replace("fox", "cat")).unwrap();
    std::fs::remove_file(&missing).unwrap();
    for (model, code) in [
        ("changed", "model_digest_mismatch"),
        ("missing", "model_unavailable"),
    ] {
        let id = server
            .submit(json!({"model": model, "input": "the fox", "max_output_tokens": 5}))
            .await;
        let task = server.wait_status(&id, "failed").await;
        assert_eq!(task["error"]["code"], code, "{task}");
        let events = server.all_events(&id).await;
        let last = events.last().unwrap();
        assert_eq!(last["type"], "response.failed");
        assert_eq!(last["data"]["error"]["code"], code);
    }
}

/// the README, docs/api.md: files in `--models-dir` are registered at startup (id = file stem), and
/// `lmsp models add` registers a file offline, printing its digest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_dir_files_register_at_startup_and_the_cli_adds_offline() {
    let temp = tempfile::tempdir().unwrap();
    let models = temp.path().join("my-models");
    std::fs::create_dir(&models).unwrap();
    std::fs::write(models.join("tiny-llm.gguf"), CORPUS).unwrap();
    let mut server = TestServer::start(&["--models-dir", models.to_str().unwrap()]);
    let (status, model) = server.get("/v1/models/tiny-llm").await;
    assert_eq!(status, 200, "{model}");
    assert_eq!(model["digest"], sha256_of(CORPUS.as_bytes()));

    let offline = temp.path().join("offline.gguf");
    std::fs::write(&offline, b"weights").unwrap();
    server.kill();
    let output = Command::new(lmsp_binary())
        .args(["models", "add", "offline-model"])
        .arg(&offline)
        .arg("--data-dir")
        .arg(&server.data_dir)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed = String::from_utf8(output.stdout).unwrap();
    assert!(printed.contains(&sha256_of(b"weights")), "{printed}");
    // A file inside the server's models directory, added offline with that `--models-dir`, is
    // stored relative to it, and the server finds it there.
    std::fs::write(models.join("story.txt"), CORPUS).unwrap();
    let output = Command::new(lmsp_binary())
        .args(["models", "add", "story"])
        .arg(models.join("story.txt"))
        .arg("--models-dir")
        .arg(&models)
        .arg("--data-dir")
        .arg(&server.data_dir)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    server.kill_and_restart(&["--models-dir", models.to_str().unwrap()]);
    let (status, model) = server.get("/v1/models/offline-model").await;
    assert_eq!(status, 200, "{model}");
    assert_eq!(model["size_bytes"], 7);
    let (status, model) = server.get("/v1/models/story").await;
    assert_eq!(status, 200, "{model}");
    assert_eq!(model["path"], "story.txt", "{model}");
    let mut body = prompt(3, 5, "fail");
    body["model"] = Value::from("story");
    let id = server.submit(body).await;
    server.wait_status(&id, "completed").await;
}
