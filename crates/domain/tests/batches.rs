//! The batch rules of `domain::batch`: the checks of a batch's lines, its life as steps, what
//! its upkeep does next, which count a line's end adds to, and where a finished line's answer
//! goes. Mutation testing (`scripts/mutants-domain`) runs these against every change it makes
//! to `batch.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use lmsp_domain::batch::{
    counted, first_errors, line_outcome, parse_completion_window, request_id, Batch, BatchEndpoint,
    BatchLine, BatchStatus, BatchWork, ContentDigest, Counter, DuplicateLine, FilePurpose,
    LineCancel, LineCheck, LineEnvelope, LineError, LineErrorCode, LineOutcome, NewBatch,
    RequestCounts, MAX_CUSTOM_ID_CHARS, MAX_LINES, MAX_LINE_ERRORS,
};
use lmsp_domain::{
    BatchId, ClientId, FileId, Input, InstanceId, ModelId, NewTask, RestartPolicy, ServiceTier,
    Task, TaskId, TaskSpec, TaskStatus, Timestamp,
};
use ulid::Ulid;

const HOUR: i64 = 3_600_000;

fn envelope<'a>(custom_id: &'a str, url: &'a str) -> LineEnvelope<'a> {
    LineEnvelope {
        custom_id: Some(custom_id),
        method: Some("POST"),
        url: Some(url),
    }
}

fn code(result: Result<(), lmsp_domain::batch::LineError>) -> Option<LineErrorCode> {
    result.err().map(|error| error.code)
}

#[test]
fn a_line_check_takes_good_lines_and_names_each_fault_with_its_line() {
    let mut check = LineCheck::new(BatchEndpoint::Responses);
    assert_eq!(check.check(envelope("a", "/v1/responses")), Ok(()));
    assert_eq!(check.lines(), 1);
    // A good line's duplicate is the store's to find (`staged_duplicates`); one of a line
    // refused for its body is the check's.
    assert_eq!(check.check(envelope("a", "/v1/responses")), Ok(()));
    check.refused_body("a");
    let duplicate = check.check(envelope("a", "/v1/responses")).unwrap_err();
    assert_eq!(duplicate.code, LineErrorCode::DuplicateCustomId);
    assert_eq!(duplicate.line, Some(3));
    assert_eq!(
        duplicate,
        DuplicateLine {
            line: 3,
            custom_id: String::from("a")
        }
        .error()
    );
    assert_eq!(
        code(check.check(envelope("b", "/v1/chat/completions"))),
        Some(LineErrorCode::InvalidUrl)
    );
    assert_eq!(
        code(check.check(LineEnvelope {
            method: Some("GET"),
            ..envelope("c", "/v1/responses")
        })),
        Some(LineErrorCode::InvalidMethod)
    );
    assert_eq!(
        code(check.check(LineEnvelope {
            method: None,
            ..envelope("c2", "/v1/responses")
        })),
        Some(LineErrorCode::InvalidMethod)
    );
    assert_eq!(
        code(check.check(envelope("", "/v1/responses"))),
        Some(LineErrorCode::InvalidCustomId)
    );
    assert_eq!(
        code(check.check(LineEnvelope {
            custom_id: None,
            ..envelope("x", "/v1/responses")
        })),
        Some(LineErrorCode::InvalidCustomId)
    );
    let longest = "x".repeat(MAX_CUSTOM_ID_CHARS);
    assert_eq!(check.check(envelope(&longest, "/v1/responses")), Ok(()));
    let too_long = "y".repeat(MAX_CUSTOM_ID_CHARS + 1);
    assert_eq!(
        code(check.check(envelope(&too_long, "/v1/responses"))),
        Some(LineErrorCode::InvalidCustomId)
    );
    // A refused line's custom_id is not taken: only good lines claim theirs.
    assert_eq!(check.check(envelope("b", "/v1/responses")), Ok(()));
    assert_eq!(check.skip(), 12);
    assert_eq!(check.lines(), 12);
    assert_eq!(check.finish(), Ok(()));
}

/// A body-refused line's `custom_id` is remembered for the first `MAX_LINE_ERRORS` such lines
/// only: the check's memory does not grow with the file.
#[test]
fn a_check_remembers_the_first_body_refused_ids_only() {
    let mut check = LineCheck::new(BatchEndpoint::Responses);
    for n in 0..=MAX_LINE_ERRORS {
        let id = format!("r{n}");
        assert_eq!(check.check(envelope(&id, "/v1/responses")), Ok(()));
        check.refused_body(&id);
    }
    let last = format!("r{}", MAX_LINE_ERRORS - 1);
    assert_eq!(
        code(check.check(envelope(&last, "/v1/responses"))),
        Some(LineErrorCode::DuplicateCustomId)
    );
    let over = format!("r{MAX_LINE_ERRORS}");
    assert_eq!(check.check(envelope(&over, "/v1/responses")), Ok(()));
}

/// A refused batch reports the first `MAX_LINE_ERRORS` errors in line order, whichever list
/// each came from, a whole-file error last.
#[test]
fn a_refused_batch_reports_its_first_errors_in_line_order() {
    let at = |line| LineError::at(line, LineErrorCode::InvalidUrl, "x");
    let whole = LineError {
        code: LineErrorCode::EmptyFile,
        message: String::from("none"),
        param: None,
        line: None,
    };
    let mut errors = vec![whole.clone(), at(9), at(2)];
    errors.extend((3..4).map(|line| {
        DuplicateLine {
            line,
            custom_id: String::from("d"),
        }
        .error()
    }));
    let lines: Vec<_> = first_errors(errors).iter().map(|e| e.line).collect();
    assert_eq!(lines, [Some(2), Some(3), Some(9), None]);
    let many: Vec<LineError> = (1..=MAX_LINE_ERRORS as u32 + 5).rev().map(at).collect();
    let first = first_errors(many);
    assert_eq!(first.len(), MAX_LINE_ERRORS);
    assert_eq!(first[0].line, Some(1));
    assert_eq!(
        first[MAX_LINE_ERRORS - 1].line,
        Some(MAX_LINE_ERRORS as u32)
    );
}

#[test]
fn a_chat_batch_takes_chat_lines_only() {
    let mut check = LineCheck::new(BatchEndpoint::ChatCompletions);
    assert_eq!(check.check(envelope("a", "/v1/chat/completions")), Ok(()));
    assert_eq!(
        code(check.check(envelope("b", "/v1/responses"))),
        Some(LineErrorCode::InvalidUrl)
    );
}

#[test]
fn an_empty_file_and_one_line_too_many_are_refused() {
    let check = LineCheck::new(BatchEndpoint::Responses);
    let empty = check.finish().unwrap_err();
    assert_eq!((empty.code, empty.line), (LineErrorCode::EmptyFile, None));
    let mut check = LineCheck::new(BatchEndpoint::Responses);
    for line in 1..MAX_LINES {
        check.skip();
        assert_eq!(check.lines(), line);
    }
    assert_eq!(check.check(envelope("last", "/v1/responses")), Ok(()));
    let over = check.check(envelope("over", "/v1/responses")).unwrap_err();
    assert_eq!(over.code, LineErrorCode::TooManyLines);
    assert_eq!(over.line, Some(MAX_LINES + 1));
}

#[test]
fn endpoints_statuses_purposes_and_codes_read_back_from_their_names() {
    for endpoint in [BatchEndpoint::Responses, BatchEndpoint::ChatCompletions] {
        assert_eq!(BatchEndpoint::parse(endpoint.url()), Some(endpoint));
    }
    assert_eq!(BatchEndpoint::parse("/v1/embeddings"), None);
    for status in [
        BatchStatus::Validating,
        BatchStatus::Failed,
        BatchStatus::InProgress,
        BatchStatus::Finalizing,
        BatchStatus::Completed,
        BatchStatus::Expired,
        BatchStatus::Cancelling,
        BatchStatus::Cancelled,
    ] {
        assert_eq!(BatchStatus::parse(status.as_str()), Some(status));
    }
    assert_eq!(BatchStatus::InProgress.as_str(), "in_progress");
    assert_eq!(BatchStatus::parse("done"), None);
    assert_eq!(FilePurpose::parse("batch"), Some(FilePurpose::Batch));
    assert_eq!(
        FilePurpose::parse("batch_output"),
        Some(FilePurpose::BatchOutput)
    );
    assert_eq!(FilePurpose::parse("assistants"), None);
    assert_eq!(FilePurpose::Batch.as_str(), "batch");
    assert_eq!(FilePurpose::BatchOutput.as_str(), "batch_output");
    assert_eq!(LineErrorCode::InvalidJsonLine.as_str(), "invalid_json_line");
    assert_eq!(
        LineErrorCode::parse("duplicate_custom_id"),
        Some(LineErrorCode::DuplicateCustomId)
    );
    assert_eq!(LineErrorCode::parse("nope"), None);
    assert_eq!(LineCancel::BatchExpired.as_str(), "batch_expired");
}

#[test]
fn only_the_four_ends_are_finished_and_only_validating_or_running_batches_cancel() {
    use BatchStatus::*;
    let finished = [Failed, Completed, Expired, Cancelled];
    for status in [
        Validating, Failed, InProgress, Finalizing, Completed, Expired, Cancelling, Cancelled,
    ] {
        assert_eq!(status.is_finished(), finished.contains(&status), "{status}");
        assert_eq!(
            status.cancellable(),
            matches!(status, Validating | InProgress),
            "{status}"
        );
    }
    assert!(Cancelling.sweeps(false));
    assert!(Finalizing.sweeps(true));
    assert!(!Finalizing.sweeps(false));
    assert!(!InProgress.sweeps(true));
    assert_eq!(Cancelling.ended(true), Cancelled);
    assert_eq!(Finalizing.ended(true), Expired);
    assert_eq!(Finalizing.ended(false), Completed);
}

#[test]
fn a_line_counts_as_completed_or_failed_once_its_task_ends() {
    assert_eq!(counted(TaskStatus::Completed), Some(Counter::Completed));
    assert_eq!(counted(TaskStatus::Failed), Some(Counter::Failed));
    assert_eq!(counted(TaskStatus::Cancelled), Some(Counter::Failed));
    for status in TaskStatus::UNFINISHED {
        assert_eq!(counted(status), None, "{status}");
    }
    let counts = |total, completed, failed| RequestCounts {
        total,
        completed,
        failed,
    };
    assert!(counts(3, 2, 1).all_counted());
    assert!(!counts(3, 1, 1).all_counted());
    assert!(counts(0, 0, 0).all_counted());
}

fn batch() -> Batch {
    Batch::new(NewBatch {
        id: BatchId::from_ulid(Ulid::from_parts(1, 1)),
        client_id: ClientId::from_ulid(Ulid::from_parts(1, 2)),
        endpoint: BatchEndpoint::Responses,
        input_file_id: FileId::from_ulid(Ulid::from_parts(1, 3)),
        completion_window_ms: HOUR,
        metadata: Default::default(),
        created_at: Timestamp::from_millis(1_000),
    })
}

fn at(millis: i64) -> Timestamp {
    Timestamp::from_millis(millis)
}

#[test]
fn a_batch_lives_validating_in_progress_finalizing_completed() {
    let new = batch();
    assert_eq!(new.status, BatchStatus::Validating);
    assert_eq!(new.expires_at(), at(1_000 + HOUR));
    assert_eq!(new.work(at(2_000)), BatchWork::Validate);
    assert_eq!(new.ended_at(), None);
    let started = new.started(at(2_000));
    assert_eq!(
        (started.status, started.in_progress_at),
        (BatchStatus::InProgress, Some(at(2_000)))
    );
    let running = Batch {
        counts: RequestCounts {
            total: 2,
            completed: 1,
            failed: 0,
        },
        ..started.clone()
    };
    assert_eq!(running.work(at(3_000)), BatchWork::Wait);
    let counted = Batch {
        counts: RequestCounts {
            total: 2,
            completed: 1,
            failed: 1,
        },
        ..started
    };
    assert_eq!(counted.work(at(3_000)), BatchWork::Finalize);
    let finalizing = counted.finalizing(false, at(4_000));
    assert_eq!(
        (
            finalizing.status,
            finalizing.finalizing_at,
            finalizing.expired_at
        ),
        (BatchStatus::Finalizing, Some(at(4_000)), None)
    );
    assert_eq!(finalizing.work(at(4_000)), BatchWork::Finalize);
    let output = FileId::from_ulid(Ulid::from_parts(2, 1));
    let errors = FileId::from_ulid(Ulid::from_parts(2, 2));
    let ended = finalizing.ended(Some(output), Some(errors), at(5_000));
    assert_eq!(ended.status, BatchStatus::Completed);
    assert_eq!(
        (ended.output_file_id, ended.error_file_id),
        (Some(output), Some(errors))
    );
    assert_eq!(
        (ended.completed_at, ended.cancelled_at, ended.finalizing_at),
        (Some(at(5_000)), None, Some(at(4_000)))
    );
    assert_eq!(ended.ended_at(), Some(at(5_000)));
    assert_eq!(ended.work(at(6_000)), BatchWork::Wait);
}

#[test]
fn a_batch_past_its_window_expires_then_sweeps_then_ends_expired() {
    let started = Batch {
        counts: RequestCounts {
            total: 3,
            completed: 0,
            failed: 0,
        },
        ..batch().started(at(2_000))
    };
    assert_eq!(started.work(at(1_000 + HOUR - 1)), BatchWork::Wait);
    assert_eq!(started.work(at(1_000 + HOUR)), BatchWork::Expire);
    let expiring = Batch {
        counts: RequestCounts {
            total: 3,
            completed: 1,
            failed: 0,
        },
        ..started.finalizing(true, at(1_000 + HOUR))
    };
    assert_eq!(expiring.expired_at, Some(at(1_000 + HOUR)));
    assert_eq!(expiring.work(at(2 * HOUR)), BatchWork::Sweep);
    let swept = Batch {
        counts: RequestCounts {
            total: 3,
            completed: 1,
            failed: 2,
        },
        ..expiring
    };
    assert_eq!(swept.work(at(2 * HOUR)), BatchWork::Finalize);
    let ended = swept.ended(None, None, at(2 * HOUR));
    assert_eq!(ended.status, BatchStatus::Expired);
    assert_eq!((ended.completed_at, ended.cancelled_at), (None, None));
    assert_eq!(ended.ended_at(), Some(at(1_000 + HOUR)));
}

#[test]
fn a_cancelled_batch_sweeps_then_ends_cancelled_and_an_ended_one_refuses_a_cancel() {
    let started = batch().started(at(2_000));
    let cancelling = started.cancelled_by_client(at(3_000)).unwrap();
    assert_eq!(
        (cancelling.status, cancelling.cancelling_at),
        (BatchStatus::Cancelling, Some(at(3_000)))
    );
    let pending = Batch {
        counts: RequestCounts {
            total: 2,
            completed: 1,
            failed: 0,
        },
        ..cancelling.clone()
    };
    assert_eq!(pending.work(at(3_000)), BatchWork::Sweep);
    let counted = Batch {
        counts: RequestCounts {
            total: 2,
            completed: 1,
            failed: 1,
        },
        ..cancelling
    };
    assert_eq!(counted.work(at(3_000)), BatchWork::Finalize);
    let ended = counted.ended(None, None, at(4_000));
    assert_eq!(ended.status, BatchStatus::Cancelled);
    assert_eq!(
        (ended.cancelled_at, ended.completed_at),
        (Some(at(4_000)), None)
    );
    assert_eq!(ended.finalizing_at, Some(at(4_000)));
    assert_eq!(ended.ended_at(), Some(at(4_000)));
    assert_eq!(ended.cancelled_by_client(at(5_000)), None);
    assert!(batch().cancelled_by_client(at(5_000)).is_some());
}

#[test]
fn a_refused_batch_keeps_its_errors_and_ends_when_refused() {
    let error = lmsp_domain::batch::LineError::at(3, LineErrorCode::InvalidUrl, "wrong");
    let refused = batch().refused(vec![error.clone()], at(2_000));
    assert_eq!(refused.status, BatchStatus::Failed);
    assert_eq!(refused.errors, vec![error]);
    assert_eq!(refused.ended_at(), Some(at(2_000)));
    assert_eq!(refused.work(at(3_000)), BatchWork::Wait);
}

#[test]
fn batches_are_visible_to_their_client_and_the_service_only() {
    let batch = batch();
    assert!(batch.visible_to(None));
    assert!(batch.visible_to(Some(batch.client_id)));
    assert!(!batch.visible_to(Some(ClientId::from_ulid(Ulid::from_parts(9, 9)))));
}

fn line_task(status: TaskStatus) -> Task {
    let mut task = Task::new_queued(NewTask {
        id: TaskId::from_ulid(Ulid::from_parts(5, 5)),
        client_id: ClientId::from_ulid(Ulid::from_parts(1, 2)),
        owner: InstanceId::from_ulid(Ulid::from_parts(1, 4)),
        model: ModelId::parse("reference").unwrap(),
        on_restart: RestartPolicy::Resume,
        background: false,
        spec: TaskSpec {
            input: Input::Text(String::from("hi")),
            instructions: None,
            max_output_tokens: 4,
            seed: 1,
            temperature: None,
            top_p: None,
            previous_response_id: None,
            controls: Default::default(),
        },
        metadata: Default::default(),
        created_at: at(0),
        service_tier: ServiceTier::Flex,
    });
    task.status = status;
    task.batch = Some(BatchLine {
        batch_id: batch().id,
        line: 1,
        custom_id: String::from("a"),
    });
    task
}

/// A line's task that ended `status` at `finished`.
fn finished_line(status: TaskStatus, finished: i64) -> Task {
    Task {
        finished_at: Some(at(finished)),
        ..line_task(status)
    }
}

#[test]
fn a_finished_line_goes_to_the_output_or_the_error_file_by_how_it_ended() {
    let started = batch().started(at(2_000));
    let finalizing = started.finalizing(false, at(9_000));
    let cancelling = started.cancelled_by_client(at(5_000)).unwrap();
    let expiring = started.finalizing(true, at(5_000));
    let completed = finished_line(TaskStatus::Completed, 6_000);
    for batch in [&finalizing, &cancelling, &expiring] {
        assert_eq!(line_outcome(&completed, batch), Some(LineOutcome::Output));
    }
    let failed = finished_line(TaskStatus::Failed, 6_000);
    assert_eq!(line_outcome(&failed, &expiring), Some(LineOutcome::Failed));
    let cancelled = finished_line(TaskStatus::Cancelled, 6_000);
    assert_eq!(
        line_outcome(&cancelled, &cancelling),
        Some(LineOutcome::Cancelled(LineCancel::BatchCancelled))
    );
    assert_eq!(
        line_outcome(&cancelled, &expiring),
        Some(LineOutcome::Cancelled(LineCancel::BatchExpired))
    );
    assert_eq!(
        line_outcome(&line_task(TaskStatus::Running), &finalizing),
        None
    );
    assert_eq!(
        request_id(completed.id),
        format!("batch_req_{}", completed.id.ulid())
    );
}

#[test]
fn a_line_cancelled_by_itself_says_so_and_not_that_its_batch_was_cancelled() {
    let started = batch().started(at(2_000));
    // Its task was cancelled directly in a batch that then completed: the batch stopped nothing.
    let cancelled = finished_line(TaskStatus::Cancelled, 3_000);
    let completing = started.finalizing(false, at(9_000));
    let outcome = line_outcome(&cancelled, &completing);
    assert_eq!(outcome, Some(LineOutcome::Cancelled(LineCancel::Request)));
    assert_eq!(LineCancel::Request.as_str(), "cancelled");
    assert_eq!(
        LineCancel::Request.message(),
        "the request was cancelled before it finished"
    );
    // Cancelled before the batch's cancel or expiry came: still its own cancel.
    let cancelling = started.cancelled_by_client(at(5_000)).unwrap();
    let expiring = started.finalizing(true, at(5_000));
    for batch in [&cancelling, &expiring] {
        assert_eq!(
            line_outcome(&cancelled, batch),
            Some(LineOutcome::Cancelled(LineCancel::Request)),
            "{:?}",
            batch.status
        );
    }
    // Stopped from the batch's cancel or expiry on: the batch's.
    let stopped = finished_line(TaskStatus::Cancelled, 5_000);
    assert_eq!(
        line_outcome(&stopped, &cancelling),
        Some(LineOutcome::Cancelled(LineCancel::BatchCancelled))
    );
    assert_eq!(
        line_outcome(&stopped, &expiring),
        Some(LineOutcome::Cancelled(LineCancel::BatchExpired))
    );
    assert_eq!(LineCancel::BatchCancelled.as_str(), "batch_cancelled");
    assert_eq!(LineCancel::BatchExpired.as_str(), "batch_expired");
}

#[test]
fn a_completion_window_is_hours_minutes_or_seconds_between_a_second_and_a_week() {
    assert_eq!(parse_completion_window("24h"), Some(24 * HOUR));
    assert_eq!(parse_completion_window("90m"), Some(90 * 60_000));
    assert_eq!(parse_completion_window("1s"), Some(1_000));
    assert_eq!(parse_completion_window("168h"), Some(168 * HOUR));
    for refused in [
        "169h", "0s", "h", "", "24", "24d", "-1h", "1.5h", "+1h", " 1h",
    ] {
        assert_eq!(parse_completion_window(refused), None, "{refused:?}");
    }
}

#[test]
fn a_content_digest_is_the_size_and_sha256_of_what_streamed_past() {
    let mut digest = ContentDigest::default();
    digest.update(b"ab");
    digest.update(b"c");
    assert_eq!(digest.bytes(), 3);
    assert_eq!(
        digest.finish(),
        (
            3,
            String::from("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        )
    );
}
