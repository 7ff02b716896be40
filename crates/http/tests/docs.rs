//! The reference pages in `docs/` are checked against the code they describe: every path and
//! method of the OpenAPI document, every error code, every task error code and every event kind
//! is named there, so a new endpoint, code or event cannot be added without documenting it; the
//! recovery tables are the code's table cell by cell (P-8); the index links every page; and no
//! file of the repository sends its reader to a document outside it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use lmsp_domain::error_code::TaskErrorCode;
use lmsp_domain::event::EventKind;
use lmsp_domain::recovery::{plan, Move, RestartPolicy};
use lmsp_domain::status::TaskStatus;
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

/// A cell of a recovery table as a page writes it: the status and event it names (none for a
/// cell that writes nothing), the task error code it names, and whether it says the task goes on
/// from its snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
struct WrittenCell {
    status: Option<TaskStatus>,
    event: Option<EventKind>,
    error_code: Option<TaskErrorCode>,
    resumes_from_snapshot: bool,
}

/// The text between backticks.
fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

fn written_cell(text: &str) -> WrittenCell {
    let spans = code_spans(text);
    WrittenCell {
        status: spans.iter().find_map(|s| TaskStatus::parse(s).ok()),
        event: spans.iter().find_map(|s| EventKind::parse(s).ok()),
        error_code: spans.iter().find_map(|s| TaskErrorCode::parse(s)),
        resumes_from_snapshot: text.contains("snapshot"),
    }
}

/// What a cell must say for the move `plan` decides for a task found in `found`: a move names
/// its new status, its event, its error code and whether it resumes; an untouched task names no
/// event (and, if it names a status, its own) and says "no event".
fn cell_says(found: TaskStatus, planned: Move, text: &str) -> bool {
    let written = written_cell(text);
    match planned {
        Move::Untouched => {
            written.event.is_none()
                && written.status.is_none_or(|status| status == found)
                && written.error_code.is_none()
                && text.contains("no event")
        }
        Move::Moved {
            status,
            event,
            error_code,
            resumes_from_snapshot,
            ..
        } => {
            written
                == WrittenCell {
                    status: Some(status),
                    event: Some(event),
                    error_code,
                    resumes_from_snapshot,
                }
        }
    }
}

/// The recovery table of a page: the table whose header starts `| found at startup |`, as
/// (status found, policy, cell text) for each cell.
fn recovery_table(page: &str) -> Vec<(TaskStatus, RestartPolicy, String)> {
    let mut lines = page
        .lines()
        .skip_while(|line| !line.starts_with("| found at startup |"));
    let header = lines.next().expect("a table headed `| found at startup |`");
    let policies: Vec<RestartPolicy> = header
        .split('|')
        .skip(2)
        .filter(|cell| !cell.trim().is_empty())
        .map(|cell| {
            let name = code_spans(cell).first().copied().unwrap_or(cell.trim());
            RestartPolicy::parse(name).unwrap_or_else(|e| panic!("header: {e}"))
        })
        .collect();
    let mut cells = Vec::new();
    for row in lines.skip(1).take_while(|line| line.starts_with('|')) {
        let columns: Vec<&str> = row.split('|').map(str::trim).collect();
        let found_name = code_spans(columns[1])
            .first()
            .copied()
            .unwrap_or(columns[1]);
        let found = TaskStatus::parse(found_name).unwrap_or_else(|e| panic!("row `{row}`: {e}"));
        assert_eq!(
            columns.len(),
            policies.len() + 3,
            "row `{row}` has another number of cells than the header"
        );
        for (policy, text) in policies.iter().zip(&columns[2..]) {
            cells.push((found, *policy, (*text).to_owned()));
        }
    }
    cells
}

/// P-8…P-10: the recovery table of `page` has one cell for each status and policy, and each
/// says what `lmsp_domain::recovery::plan` does.
fn check_recovery_table(name: &str) {
    let page = page(name);
    let cells = recovery_table(&page);
    let mut seen = std::collections::HashSet::new();
    let mut wrong = Vec::new();
    for (found, policy, text) in &cells {
        assert!(
            seen.insert((*found, *policy)),
            "docs/{name}: the cell ({found}, {policy}) is there twice"
        );
        if !cell_says(*found, plan(*found, *policy), text) {
            wrong.push(format!(
                "({found}, {policy}) says `{text}`, the code does {:?}",
                plan(*found, *policy)
            ));
        }
    }
    let all = TaskStatus::ALL.len() * RestartPolicy::ALL.len();
    assert_eq!(all, 21, "seven statuses by three policies");
    assert_eq!(
        cells.len(),
        all,
        "docs/{name}: the recovery table has {} cells, not one per status and policy",
        cells.len()
    );
    assert!(wrong.is_empty(), "docs/{name}: {wrong:#?}");
    assert!(
        page.contains("`restarts`"),
        "docs/{name} does not say that a moved task's `restarts` grows"
    );
}

/// P-8: the recovery table of docs/rules.md is the code's, all 21 cells.
#[test]
fn the_rules_page_recovery_table_is_the_codes_p8() {
    check_recovery_table("rules.md");
}

/// P-8: the recovery table of docs/recovery.md is the code's, all 21 cells.
#[test]
fn the_recovery_page_table_is_the_codes_p8() {
    check_recovery_table("recovery.md");
}

/// The table check itself catches a wrong cell: a page that says a running `retry` task is
/// resumed, or names no event for a failed move, is refused.
#[test]
fn a_wrong_recovery_cell_is_caught() {
    let running = TaskStatus::Running;
    let queued = TaskStatus::Queued;
    assert!(cell_says(
        running,
        plan(running, RestartPolicy::Retry),
        "`queued` + `response.queued`"
    ));
    assert!(!cell_says(
        running,
        plan(running, RestartPolicy::Retry),
        "`running` + `response.resumed`, continued from its snapshot"
    ));
    assert!(!cell_says(
        queued,
        plan(queued, RestartPolicy::Fail),
        "`failed` + `response.failed`"
    ));
    assert!(!cell_says(
        queued,
        plan(queued, RestartPolicy::Retry),
        "`queued` + `response.queued`"
    ));
}

/// Every page in docs/ is linked from the index, docs/README.md.
#[test]
fn the_index_links_every_page() {
    let index = page("README.md");
    let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
    let mut pages = 0;
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&docs).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if !name.ends_with(".md") || name == "README.md" {
            continue;
        }
        pages += 1;
        if !index.contains(&format!("]({name})")) {
            missing.push(name);
        }
    }
    assert!(pages >= 8, "only {pages} pages in docs/");
    assert!(
        missing.is_empty(),
        "docs/README.md does not link {missing:?}"
    );
}

/// Names of texts outside the repository that no file of it may send the reader to (built from
/// pieces, so that this file does not name them itself).
const OUTSIDE: [&str; 3] = [
    concat!("API", ".md"),
    concat!("DESIGN", ".md"),
    concat!("../", "shared"),
];

/// The files a reader of the repository reads: documentation, code and scripts, outside
/// `target/`, dependencies and hidden directories.
fn repository_texts(dir: &std::path::Path, found: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        let name = entry.file_name().into_string().unwrap_or_default();
        if entry.file_type().unwrap().is_dir() {
            if !(name.starts_with('.') || name == "target" || name == "node_modules") {
                repository_texts(&path, found);
            }
        } else if ["md", "rs", "toml", "py", "mjs", "js", "sh", "html"]
            .iter()
            .any(|ext| path.extension().is_some_and(|e| e == *ext))
        {
            found.push(path);
        }
    }
}

/// The repository stands on its own: no page, comment or script in it sends the reader to a
/// document outside it.
#[test]
fn no_file_refers_to_a_document_outside_the_repository() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    repository_texts(&root, &mut files);
    assert!(
        files.iter().any(|f| f.ends_with("README.md")),
        "the walk found no README.md under {}",
        root.display()
    );
    let mut hits = Vec::new();
    for file in &files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for (number, line) in text.lines().enumerate() {
            if OUTSIDE.iter().any(|name| line.contains(name)) {
                hits.push(format!("{}:{}: {line}", file.display(), number + 1));
            }
        }
    }
    assert!(hits.is_empty(), "outside references: {hits:#?}");
}
