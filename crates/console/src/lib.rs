//! The web console of LMSP, served at `/console/`: a driving adapter beside `lmsp-http` that
//! speaks only the public HTTP API, from the browser, with the token the user pastes in. It
//! never touches the store or the use cases: this crate only serves static files.
//!
//! The files under `web/` (plain HTML, CSS and ES modules; no build step, no framework) are
//! embedded in the binary at compile time by `rust-embed`, in every profile, so `cargo build`
//! needs no Node.js and a running service never reads them from disk.
//!
//! [`router`] serves them with their content types, an `ETag` and `Cache-Control: no-cache`
//! (revalidate every time: the file names are not content-hashed), and on every reply, 404s
//! included, a strict `Content-Security-Policy` (only this origin's scripts, styles and
//! connections; no inline script or style; Trusted Types required, with no policy allowed, so
//! no string ever reaches an HTML sink), `X-Content-Type-Options: nosniff`,
//! `Referrer-Policy: no-referrer` and `X-Frame-Options: DENY`. Any other path under `/console/`
//! without a file extension is a route of the single-page app and gets `index.html`; a path
//! with a `..`, `.` or empty segment, a backslash or a percent-encoded byte is a 404.

use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use rust_embed::RustEmbed;

/// The files of the console, embedded at compile time.
#[derive(RustEmbed)]
#[folder = "web/"]
struct Assets;

/// Where the console is mounted.
pub const PREFIX: &str = "/console";

/// The policy of every console reply.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
    style-src 'self'; img-src 'self' data:; connect-src 'self'; font-src 'self'; \
    object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'; \
    require-trusted-types-for 'script'; trusted-types 'none'";

/// The console's routes: `/console` (a redirect to `/console/`), `/console/` and everything
/// under it. They need no token: the files are public, the data is fetched by the page with
/// the user's token.
pub fn router() -> Router {
    Router::new()
        .route(PREFIX, get(redirect_to_index))
        .route("/console/", get(index))
        .route("/console/{*path}", get(file))
}

async fn redirect_to_index() -> Response {
    with_security_headers(Redirect::permanent("/console/").into_response())
}

async fn index(headers: HeaderMap) -> Response {
    serve("index.html", &headers)
}

async fn file(uri: Uri, headers: HeaderMap) -> Response {
    // The raw path, as sent: the router has already decoded `{*path}`, which would hide a
    // `%2e%2e`. Judge the bytes the client sent.
    let Some(rest) = uri.path().strip_prefix("/console/") else {
        return not_found();
    };
    if !is_plain(rest) {
        return not_found();
    }
    if Assets::get(rest).is_some() {
        return serve(rest, &headers);
    }
    let last = rest.rsplit('/').next().unwrap_or_default();
    if last.contains('.') {
        // A missing file, not a route of the app.
        return not_found();
    }
    serve("index.html", &headers)
}

/// Whether a path below `/console/` is made of plain segments only.
fn is_plain(path: &str) -> bool {
    !path.contains(['%', '\\', '\0'])
        && path
            .split('/')
            .all(|segment| !segment.is_empty() && segment != "." && segment != "..")
}

fn serve(path: &str, headers: &HeaderMap) -> Response {
    let Some(file) = Assets::get(path) else {
        return not_found();
    };
    let etag = format!("\"{}\"", hex(&file.metadata.sha256_hash()));
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.split(',').any(|tag| tag.trim() == etag));
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let mut response = file.data.into_owned().into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(content_type(path)),
        );
        response
    };
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(&etag) {
        headers.insert(header::ETAG, value);
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    with_security_headers(response)
}

fn not_found() -> Response {
    let mut response = (StatusCode::NOT_FOUND, "not found\n").into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    with_security_headers(response)
}

fn with_security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

/// The content type of an embedded file, by its extension.
fn content_type(path: &str) -> &'static str {
    match path.rsplit('.').next().unwrap_or_default() {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "json" => "application/json",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn get(path: &str, etag: Option<&str>) -> (StatusCode, HeaderMap, Vec<u8>) {
        let mut request = Request::builder().uri(path);
        if let Some(etag) = etag {
            request = request.header(header::IF_NONE_MATCH, etag);
        }
        let response = router()
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, headers, body.to_vec())
    }

    fn assert_secure(headers: &HeaderMap) {
        assert_eq!(
            headers[header::CONTENT_SECURITY_POLICY],
            CONTENT_SECURITY_POLICY
        );
        assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        assert_eq!(headers[header::REFERRER_POLICY], "no-referrer");
    }

    #[tokio::test]
    async fn the_index_is_html_with_the_policy() {
        let (status, headers, body) = get("/console/", None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers[header::CONTENT_TYPE], "text/html; charset=utf-8");
        assert_eq!(headers[header::CACHE_CONTROL], "no-cache");
        assert_secure(&headers);
        let text = String::from_utf8(body).unwrap();
        assert!(text.contains("/console/assets/app.js"));
        assert!(!text.contains("<script>"), "no inline script");
        assert!(!text.contains("style="), "no inline style");
    }

    #[tokio::test]
    async fn assets_have_their_content_types_and_revalidate_by_etag() {
        let (status, headers, _) = get("/console/assets/app.js", None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            headers[header::CONTENT_TYPE],
            "text/javascript; charset=utf-8"
        );
        assert_secure(&headers);
        let etag = headers[header::ETAG].to_str().unwrap().to_owned();
        let (status, headers, body) = get("/console/assets/app.js", Some(&etag)).await;
        assert_eq!(status, StatusCode::NOT_MODIFIED);
        assert!(body.is_empty());
        assert_secure(&headers);
        let (_, headers, _) = get("/console/assets/console.css", None).await;
        assert_eq!(headers[header::CONTENT_TYPE], "text/css; charset=utf-8");
    }

    #[tokio::test]
    async fn app_routes_get_the_index_and_missing_files_a_404() {
        for path in ["/console/tasks", "/console/tasks/task_01", "/console/login"] {
            let (status, headers, _) = get(path, None).await;
            assert_eq!(status, StatusCode::OK, "{path}");
            assert_eq!(headers[header::CONTENT_TYPE], "text/html; charset=utf-8");
        }
        let (status, headers, _) = get("/console/assets/nothing.js", None).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_secure(&headers);
    }

    #[tokio::test]
    async fn path_tricks_are_404() {
        for path in [
            "/console/../Cargo.toml",
            "/console/assets/../../Cargo.toml",
            "/console/%2e%2e/Cargo.toml",
            "/console/%2E%2E/src/lib.rs",
            "/console/assets/..%2fapp.js",
            "/console/assets%2fapp.js",
            "/console/./index.html",
            "/console//etc/passwd",
            "/console/assets%5capp.js",
            "/console/..",
        ] {
            let (status, _, _) = get(path, None).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        }
    }

    #[tokio::test]
    async fn the_bare_prefix_redirects() {
        let (status, headers, _) = get("/console", None).await;
        assert_eq!(status, StatusCode::PERMANENT_REDIRECT);
        assert_eq!(headers[header::LOCATION], "/console/");
    }
}
