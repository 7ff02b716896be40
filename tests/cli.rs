//! The command line as its user meets it: bad values are refused with a message that says what
//! is expected, the offline commands never create a database, `clients add` prints what
//! `revoke` needs, `clients list` has a header, and `--help` is written for the user.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lmsp_tests as common;

use std::process::{Command, Output};

use common::{lmsp_binary, TestServer};

/// Runs `lmsp` with `args` (no environment that could change its defaults).
fn lmsp(args: &[&str]) -> Output {
    Command::new(lmsp_binary())
        .args(args)
        .env_remove("LMSP_DATA_DIR")
        .env_remove("LMSP_WORKERS")
        .env_remove("LMSP_RETENTION")
        .env_remove("LMSP_PURGE_INTERVAL")
        .output()
        .expect("lmsp runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A value `serve` cannot run with is refused before anything starts, exits non-zero, and the
/// message names the flag and says what is expected (a duration's shape included); nothing is
/// created in the data directory.
#[test]
fn serve_refuses_values_it_cannot_run_with_and_says_what_is_expected() {
    let temp = tempfile::tempdir().unwrap();
    let data_dir = temp.path().join("data");
    let data = data_dir.to_str().unwrap();
    let rows: [(&[&str], &str, &[&str]); 4] = [
        (&["--workers", "0"], "--workers", &["0 is not in 1.."]),
        (
            &["--purge-interval", "0s"],
            "--purge-interval",
            &["longer than zero"],
        ),
        (
            &["--retention", "foo"],
            "--retention",
            &["not a duration", "30s", "7d"],
        ),
        (
            &["--request-timeout", "soon"],
            "--request-timeout",
            &["not a duration"],
        ),
    ];
    for (flags, flag, expected) in rows {
        let mut args = vec!["serve", "--data-dir", data, "--listen", "127.0.0.1:0"];
        args.extend_from_slice(flags);
        let output = lmsp(&args);
        let message = stderr(&output);
        assert!(!output.status.success(), "{flags:?} was accepted");
        assert!(message.contains(flag), "{flags:?}: {message}");
        for words in expected {
            assert!(message.contains(words), "{flags:?}: {message}");
        }
        assert!(!data_dir.exists(), "{flags:?} created the data directory");
    }
}

/// The offline commands on a data directory that has no database exit non-zero, say how to
/// create one, and create nothing (no directory, no `lmsp.db`).
#[test]
fn offline_commands_on_a_missing_data_directory_fail_and_create_nothing() {
    let temp = tempfile::tempdir().unwrap();
    let missing = temp.path().join("nowhere");
    let data = missing.to_str().unwrap();
    let commands: [&[&str]; 3] = [
        &["clients", "list", "--data-dir", data],
        &[
            "clients",
            "add",
            "--name",
            "x",
            "--scope",
            "responses:read",
            "--data-dir",
            data,
        ],
        &["backup", "/dev/null/never", "--data-dir", data],
    ];
    for args in commands {
        let output = lmsp(args);
        let message = stderr(&output);
        assert!(!output.status.success(), "{args:?} succeeded");
        assert!(
            message.starts_with("error: there is no LMSP database"),
            "{args:?}: {message}"
        );
        assert!(message.contains("lmsp serve --data-dir"), "{message}");
        assert!(!missing.exists(), "{args:?} created {}", missing.display());
    }
}

/// `clients add` prints the new client's `cli_…` id (what `revoke` needs) and then its token;
/// `clients list` opens with a header line and shows the client by that id; `revoke` takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_add_prints_the_id_and_the_token_and_list_has_a_header() {
    let server = TestServer::start(&[]);
    let data = server.data_dir.to_str().unwrap().to_owned();

    let added = lmsp(&[
        "clients",
        "add",
        "--name",
        "reader",
        "--scope",
        "responses:read",
        "--data-dir",
        &data,
    ]);
    assert!(added.status.success(), "{}", stderr(&added));
    let printed = stdout(&added);
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(lines.len(), 2, "an id line and a token line: {printed}");
    let (id, token) = (lines[0].trim(), lines[1].trim());
    assert!(id.starts_with("cli_"), "{printed}");
    assert!(token.starts_with("lmsp_"), "{printed}");
    assert_eq!(server.get_as(token, "/v1/tasks").await.0, 200);

    let listed = lmsp(&["clients", "list", "--data-dir", &data]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    let listing = stdout(&listed);
    let header = listing.lines().next().unwrap_or_default();
    assert_eq!(
        header.split('\t').collect::<Vec<_>>(),
        [
            "ID",
            "NAME",
            "SCOPES",
            "STATE",
            "CREATED",
            "MAX_RUNNING",
            "MAX_QUEUED"
        ]
    );
    let row = listing
        .lines()
        .find(|line| line.starts_with(id))
        .unwrap_or_else(|| panic!("{id} is not listed: {listing}"));
    assert!(row.contains("\treader\tresponses:read\tactive\t"), "{row}");
    assert!(!listing.contains(token), "a listing never shows a token");

    let revoked = lmsp(&["clients", "revoke", id, "--data-dir", &data]);
    assert!(revoked.status.success(), "{}", stderr(&revoked));
    assert_eq!(server.get_as(token, "/v1/tasks").await.0, 401);
}

/// `lmsp --help` opens with what the program is for its user, not notes for its developers, and
/// each command's help says what it does.
#[test]
fn help_is_written_for_the_user() {
    let output = lmsp(&["--help"]);
    assert!(output.status.success());
    let help = stdout(&output);
    let first = help.lines().next().unwrap_or_default();
    assert!(first.starts_with("LMSP: a local model service"), "{help}");
    for developer_words in ["composition root", "adapter", "crate", "HTTP edge"] {
        assert!(
            !help.contains(developer_words),
            "`{developer_words}` in --help: {help}"
        );
    }
    for (command, says) in [
        ("serve", "Runs the service"),
        ("clients", "clients"),
        ("backup", "consistent copy"),
    ] {
        let output = lmsp(&[command, "--help"]);
        assert!(output.status.success());
        let help = stdout(&output);
        assert!(
            help.lines().next().unwrap_or_default().contains(says),
            "{command}: {help}"
        );
    }
}
