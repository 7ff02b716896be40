//! The reference pages in `docs/` are checked against the code they describe: every path and
//! method of the OpenAPI document, every error code, every task error code and every event kind
//! is named there, so a new endpoint, code or event cannot be added without documenting it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use lmsp_domain::error_code::TaskErrorCode;
use lmsp_domain::event::EventKind;
use lmsp_http::error::ErrorCode;
use strum::VariantArray;

fn page(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// docs/api.md names every method and path the OpenAPI document describes.
#[test]
fn the_api_page_names_every_endpoint_of_the_openapi_document() {
    let api = page("api.md");
    let document: serde_json::Value =
        serde_json::from_str(lmsp_http::openapi::document_json().expect("the document")).unwrap();
    let mut missing = Vec::new();
    let mut count = 0;
    for (path, operations) in document["paths"].as_object().unwrap() {
        for method in operations.as_object().unwrap().keys() {
            count += 1;
            let named = format!("`{} {path}`", method.to_uppercase());
            if !api.contains(&named) {
                missing.push(named);
            }
        }
    }
    assert!(count > 15, "only {count} operations in the document");
    assert!(missing.is_empty(), "docs/api.md does not name {missing:?}");
}

/// docs/api.md names every error code of the envelope and every task error code.
#[test]
fn the_api_page_names_every_error_code() {
    let api = page("api.md");
    let codes = ErrorCode::VARIANTS
        .iter()
        .map(|code| <&'static str>::from(*code))
        .chain(TaskErrorCode::VARIANTS.iter().map(|code| code.as_str()));
    let missing: Vec<&str> = codes
        .filter(|code| !api.contains(&format!("`{code}`")))
        .collect();
    assert!(missing.is_empty(), "docs/api.md does not name {missing:?}");
}

/// docs/events.md names every event kind.
#[test]
fn the_events_page_names_every_event_kind() {
    let events = page("events.md");
    let missing: Vec<&str> = EventKind::ALL
        .iter()
        .map(|kind| kind.name())
        .filter(|name| !events.contains(&format!("`{name}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/events.md does not name {missing:?}"
    );
}
