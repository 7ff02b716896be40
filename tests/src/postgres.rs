//! Many instances of the binary on one PostgreSQL database: a fresh database per test on the
//! test cluster (`LMSP_TEST_POSTGRES_URL`, what `scripts/postgres-test-cluster start` prints;
//! `scripts/test` starts it) and instances started on it. Without the URL a test fails, saying
//! so: it never skips.

use crate::TestServer;

/// The test cluster's URL; panics, saying how to get one, when it is not set.
pub fn test_cluster_url() -> String {
    std::env::var("LMSP_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!(
            "LMSP_TEST_POSTGRES_URL is not set: run `scripts/postgres-test-cluster start` and \
             export the URL it prints (scripts/test does both)"
        )
    })
}

/// A fresh, empty database on the test cluster; its URL.
pub async fn fresh_database() -> String {
    let base = test_cluster_url();
    let (client, connection) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot reach PostgreSQL at {base}: {e}"));
    tokio::spawn(connection);
    let name = format!(
        "lmsp_e2e_{}_{}",
        std::process::id(),
        ulid::Ulid::new().to_string().to_lowercase()
    );
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
    let (prefix, _) = base
        .rsplit_once('/')
        .unwrap_or_else(|| panic!("{base} is not a URL with a database"));
    format!("{prefix}/{name}")
}

/// Starts an instance named `name` on `database` (a 2 s lease, so a killed instance's tasks are
/// recovered quickly), with the admin token of the first instance (`None` for the first, which
/// creates the admin client and announces its token).
pub fn instance(
    database: &str,
    name: &str,
    admin_token: Option<&str>,
    extra: &[&str],
) -> TestServer {
    let mut args = vec!["--database", database, "--instance", name, "--lease", "2s"];
    args.extend_from_slice(extra);
    let mut server = TestServer::start(&args);
    if let Some(token) = admin_token {
        assert!(
            server.announced_token.is_none(),
            "only the first instance creates the admin client"
        );
        server.admin_token = token.to_owned();
    }
    server
}
