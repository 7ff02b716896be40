//! Files and batches (`BatchStore`): files' records listed per client (I-7) and deleted unless a
//! batch that has not ended reads them; a batch's lines kept aside and created all at once with
//! its start (P-2); its counts kept as its tasks end, on every write path (`batch::counted`); its
//! steps as compare-and-sets on its status; its tasks read in line order; and the purge of ended
//! batches with their tasks and written files, which the purge of finished tasks leaves alone
//! (P-5, P-6).

use lmsp_domain::auth::Scope;
use lmsp_domain::batch::{
    Batch, BatchEndpoint, BatchLine, BatchStatus, DuplicateLine, FilePurpose, LineError,
    LineErrorCode, NewBatch, RequestCounts, StoredFile,
};
use lmsp_domain::ids::{BatchId, ClientId, FileId, InstanceId};
use lmsp_domain::ports::{
    BatchStore, CreateOutcome, FileDeleteOutcome, ListOrder, Store, TaskFilter,
};
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::schedule::{ClientLimits, QueueFull};
use lmsp_domain::status::TaskStatus;
use lmsp_domain::task::{Metadata, Task};
use lmsp_domain::time::Timestamp;
use lmsp_domain::transition::Step;

use crate::fixtures::*;
use crate::support::*;
use crate::{fresh_store, StoreFactory};

/// A day, in milliseconds (a batch's completion window).
const DAY: i64 = 24 * 60 * 60 * 1000;

/// A file's record of `client`, stored at `at`.
fn stored_file(client: ClientId, purpose: FilePurpose, at: Timestamp) -> StoredFile {
    StoredFile {
        id: FileId::from_ulid(ulid()),
        client_id: client,
        filename: String::from("requests.jsonl"),
        purpose,
        bytes: 123,
        digest: String::from("ab").repeat(32),
        created_at: at,
        batch_id: None,
    }
}

/// An output file the service wrote for `batch`.
fn output_file(batch: &Batch, at: Timestamp) -> StoredFile {
    StoredFile {
        filename: format!("{}_output.jsonl", batch.id),
        batch_id: Some(batch.id),
        ..stored_file(batch.client_id, FilePurpose::BatchOutput, at)
    }
}

/// A new `validating` batch of `client` reading `input`.
fn new_batch(client: ClientId, input: FileId) -> Batch {
    let mut metadata = Metadata::new();
    metadata.insert(String::from("job"), String::from("nightly"));
    Batch::new(NewBatch {
        id: BatchId::from_ulid(ulid()),
        client_id: client,
        endpoint: BatchEndpoint::Responses,
        input_file_id: input,
        completion_window_ms: DAY,
        metadata,
        created_at: time(0),
    })
}

/// The task of `batch`'s line `line`, accepted by `owner`.
fn line_task(batch: &Batch, line: u32, owner: InstanceId) -> Task {
    let mut task = TaskBuilder::new(owner).client(batch.client_id).build();
    task.batch = Some(BatchLine {
        batch_id: batch.id,
        line,
        custom_id: format!("request-{line}"),
    });
    task
}

/// A stored upload of `client` and a stored `validating` batch reading it.
async fn validating<S: Store + ?Sized>(store: &S, client: ClientId) -> Batch {
    let input = stored_file(client, FilePurpose::Batch, time(0));
    store.insert_file(input.clone()).await.unwrap();
    let batch = new_batch(client, input.id);
    store.insert_batch(batch.clone()).await.unwrap();
    batch
}

/// A batch of `client` started with `lines` lines accepted by `owner`: the batch as stored, and
/// its tasks in line order.
async fn started<S: Store + ?Sized>(
    store: &S,
    client: ClientId,
    lines: u32,
    owner: InstanceId,
) -> (Batch, Vec<Task>) {
    let batch = validating(store, client).await;
    let tasks: Vec<Task> = (1..=lines)
        .map(|line| line_task(&batch, line, owner))
        .collect();
    store.stage_batch_tasks(tasks.clone()).await.unwrap();
    let stored = store
        .start_batch(batch.started(time(10)))
        .await
        .unwrap()
        .expect("a validating batch starts");
    let tasks = store
        .batch_tasks(batch.id, &[], 0, lines as usize + 1)
        .await
        .unwrap();
    (stored, tasks)
}

/// The batch as stored now.
async fn reread<S: Store + ?Sized>(store: &S, batch: &Batch) -> Batch {
    store.batch(batch.id).await.unwrap().expect("the batch")
}

/// Claims, loads, outputs and completes `task` on behalf of its owner.
async fn complete_line<S: Store + ?Sized>(store: &S, task: &Task) -> Task {
    let worker = task.owner;
    let running = step(
        store,
        task,
        worker,
        vec![claim(task), Step::Loaded, output("done")],
        None,
        time(20),
    )
    .await;
    finish(
        store,
        &running,
        worker,
        complete(&running, "done", time(21)),
    )
    .await
}

/// Claims `task` on behalf of its owner and fails it.
async fn fail_line<S: Store + ?Sized>(store: &S, task: &Task) -> Task {
    let worker = task.owner;
    let loading = step(store, task, worker, vec![claim(task)], None, time(20)).await;
    finish(store, &loading, worker, fail()).await
}

fn counts(total: u64, completed: u64, failed: u64) -> RequestCounts {
    RequestCounts {
        total,
        completed,
        failed,
    }
}

/// A client's files are listed newest first (`desc`) or oldest first (`asc`), each order paging
/// past its cursor in that order until none is left, with the same files either way.
pub async fn files_are_listed_in_either_order_and_paged_past_the_cursor<F: StoreFactory>(
    factory: &F,
) {
    let (store, _) = fresh_store(factory).await;
    let (a, b) = (client_id(), client_id());
    let mut mine = Vec::new();
    for n in 0..5 {
        let file = stored_file(a, FilePurpose::Batch, time(n));
        store.insert_file(file.clone()).await.unwrap();
        mine.push(file);
        // Another client's file between each two: never on the client's pages.
        store
            .insert_file(stored_file(b, FilePurpose::Batch, time(n)))
            .await
            .unwrap();
    }
    let newest_first: Vec<StoredFile> = mine.iter().rev().cloned().collect();
    for (order, expected) in [(ListOrder::Asc, &mine), (ListOrder::Desc, &newest_first)] {
        let (mut after, mut seen, mut pages) = (None, Vec::new(), Vec::new());
        loop {
            let page = store
                .list_files(Some(a), None, after, order, 2)
                .await
                .unwrap();
            after = page.items.last().map(|file| file.id);
            pages.push(page.items.len());
            seen.extend(page.items);
            if !page.has_more {
                break;
            }
        }
        assert_eq!(&seen, expected, "{order:?}: in order, only the client's");
        assert_eq!(pages, vec![2, 2, 1], "{order:?}: every file once, in pages");
    }
    let newest = store
        .list_files(Some(a), None, None, ListOrder::Desc, 1)
        .await
        .unwrap();
    assert_eq!(newest.items, vec![mine[4].clone()]);
    assert!(newest.has_more);
    let past_the_oldest = store
        .list_files(Some(a), None, Some(mine[0].id), ListOrder::Desc, 10)
        .await
        .unwrap();
    assert!(past_the_oldest.items.is_empty(), "nothing is older");
    assert!(!past_the_oldest.has_more);
}

/// I-7: a client's files are listed oldest first and only its own (the service sees every
/// client's), in pages after an id, filtered by purpose; a file reads back as stored; another
/// client's file, or none, is not found by a delete.
pub async fn batch_files_are_listed_oldest_first_per_client_and_paged_i7<F: StoreFactory>(
    factory: &F,
) {
    let (store, _) = fresh_store(factory).await;
    let (a, b) = (client_id(), client_id());
    let mut mine = Vec::new();
    for n in 0..3 {
        let file = stored_file(a, FilePurpose::Batch, time(n));
        store.insert_file(file.clone()).await.unwrap();
        mine.push(file);
    }
    let theirs = stored_file(b, FilePurpose::Batch, time(3));
    store.insert_file(theirs.clone()).await.unwrap();
    let written = StoredFile {
        batch_id: Some(BatchId::from_ulid(ulid())),
        ..stored_file(a, FilePurpose::BatchOutput, time(4))
    };
    store.insert_file(written.clone()).await.unwrap();

    assert_eq!(store.file(mine[1].id).await.unwrap(), Some(mine[1].clone()));
    assert_eq!(store.file(written.id).await.unwrap(), Some(written.clone()));
    assert_eq!(store.file(FileId::from_ulid(ulid())).await.unwrap(), None);

    let first = store
        .list_files(Some(a), None, None, ListOrder::Asc, 2)
        .await
        .unwrap();
    assert_eq!(first.items, vec![mine[0].clone(), mine[1].clone()]);
    assert!(first.has_more);
    let rest = store
        .list_files(Some(a), None, Some(mine[1].id), ListOrder::Asc, 2)
        .await
        .unwrap();
    assert_eq!(rest.items, vec![mine[2].clone(), written.clone()]);
    assert!(!rest.has_more);
    let uploads = store
        .list_files(Some(a), Some(FilePurpose::Batch), None, ListOrder::Asc, 10)
        .await
        .unwrap();
    assert_eq!(uploads.items, mine, "only the uploads");
    let everyone = store
        .list_files(None, None, None, ListOrder::Asc, 10)
        .await
        .unwrap();
    assert_eq!(
        everyone.items.len(),
        5,
        "the service sees every client's files"
    );

    assert_eq!(
        store.delete_file(theirs.id, Some(a)).await.unwrap(),
        FileDeleteOutcome::NotFound,
        "I-7: another client's file"
    );
    assert_eq!(
        store
            .delete_file(FileId::from_ulid(ulid()), None)
            .await
            .unwrap(),
        FileDeleteOutcome::NotFound
    );
    assert_eq!(
        store.file(theirs.id).await.unwrap(),
        Some(theirs),
        "nothing was deleted"
    );
}

/// A file that a batch which has not ended reads (validating, in progress, cancelling) is in use
/// and stays; once the batch ended it is deleted, and then found no more.
pub async fn a_file_an_unfinished_batch_reads_is_in_use_until_the_batch_ends<F: StoreFactory>(
    factory: &F,
) {
    let (store, _) = fresh_store(factory).await;
    let client = client_id();
    let worker = instance_id();
    let batch = validating(&store, client).await;
    let input = batch.input_file_id;
    assert_eq!(
        store.delete_file(input, Some(client)).await.unwrap(),
        FileDeleteOutcome::InUse,
        "read by a validating batch"
    );
    store
        .stage_batch_tasks(vec![line_task(&batch, 1, worker)])
        .await
        .unwrap();
    let running = store
        .start_batch(batch.started(time(10)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store.delete_file(input, None).await.unwrap(),
        FileDeleteOutcome::InUse,
        "read by a batch in progress"
    );
    let cancelling = store
        .update_batch(
            BatchStatus::InProgress,
            running.cancelled_by_client(time(20)).unwrap(),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store.delete_file(input, Some(client)).await.unwrap(),
        FileDeleteOutcome::InUse,
        "read by a cancelling batch"
    );
    assert!(store.file(input).await.unwrap().is_some());
    let ended = store
        .end_batch(
            BatchStatus::Cancelling,
            cancelling.ended(None, None, time(30)),
            Vec::new(),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ended.status, BatchStatus::Cancelled);
    assert_eq!(
        store.delete_file(input, Some(client)).await.unwrap(),
        FileDeleteOutcome::Deleted
    );
    assert_eq!(store.file(input).await.unwrap(), None);
    assert_eq!(
        store.delete_file(input, Some(client)).await.unwrap(),
        FileDeleteOutcome::NotFound
    );
}

/// A batch's `custom_id`s are unique: the store finds each kept line whose `custom_id` an
/// earlier kept line of the same batch has, in line order, up to a limit; a line kept again
/// (an interrupted validation) is not its own duplicate, and another batch's lines do not count.
pub async fn kept_lines_whose_custom_id_an_earlier_kept_line_has_are_found<F: StoreFactory>(
    factory: &F,
) {
    let (store, _) = fresh_store(factory).await;
    let client = client_id();
    let worker = instance_id();
    let batch = validating(&store, client).await;
    let other = validating(&store, client).await;
    let with_id = |batch: &Batch, line: u32, custom_id: &str| {
        let mut task = line_task(batch, line, worker);
        if let Some(kept) = task.batch.as_mut() {
            kept.custom_id = custom_id.to_owned();
        }
        task
    };
    store
        .stage_batch_tasks(vec![with_id(&other, 1, "c"), with_id(&other, 2, "z")])
        .await
        .unwrap();
    store
        .stage_batch_tasks(vec![
            with_id(&batch, 1, "a"),
            with_id(&batch, 2, "b"),
            with_id(&batch, 3, "a"),
        ])
        .await
        .unwrap();
    assert_eq!(
        store.staged_duplicates(batch.id, 10).await.unwrap(),
        [DuplicateLine {
            line: 3,
            custom_id: String::from("a")
        }]
    );
    // Kept again after an interruption, then more lines.
    store
        .stage_batch_tasks(vec![
            with_id(&batch, 2, "b"),
            with_id(&batch, 3, "a"),
            with_id(&batch, 4, "c"),
            with_id(&batch, 5, "b"),
            with_id(&batch, 6, "a"),
        ])
        .await
        .unwrap();
    let found = store.staged_duplicates(batch.id, 10).await.unwrap();
    let lines: Vec<(u32, &str)> = found
        .iter()
        .map(|d| (d.line, d.custom_id.as_str()))
        .collect();
    assert_eq!(lines, [(3, "a"), (5, "b"), (6, "a")]);
    let first: Vec<u32> = store
        .staged_duplicates(batch.id, 2)
        .await
        .unwrap()
        .iter()
        .map(|d| d.line)
        .collect();
    assert_eq!(first, [3, 5]);
    assert_eq!(store.staged_duplicates(other.id, 10).await.unwrap(), []);
}

/// P-2 for a whole batch: kept lines are invisible until the batch starts; its start creates
/// every one as a task exactly like a create (queued, its `response.created` event at 1, read by
/// id, by client and by batch, naming its line), moves the batch to `in_progress` and sets its
/// total. A line kept twice keeps its first task. A second start creates nothing.
pub async fn starting_a_batch_creates_every_kept_line_as_a_queued_task_p2<F: StoreFactory>(
    factory: &F,
) {
    let (store, _) = fresh_store(factory).await;
    let client = client_id();
    let worker = instance_id();
    let batch = validating(&store, client).await;
    let first: Vec<Task> = (1..=2)
        .map(|line| line_task(&batch, line, worker))
        .collect();
    store.stage_batch_tasks(first.clone()).await.unwrap();
    // An interrupted validation kept lines 1 and 2; the next one keeps them again, and line 3.
    let again: Vec<Task> = (2..=3)
        .map(|line| line_task(&batch, line, worker))
        .collect();
    store.stage_batch_tasks(again.clone()).await.unwrap();
    assert_eq!(store.task(first[0].id).await.unwrap(), None, "kept aside");
    let listed = store
        .list_tasks(TaskFilter {
            client_id: Some(client),
            limit: 10,
            ..TaskFilter::default()
        })
        .await
        .unwrap();
    assert!(listed.items.is_empty(), "kept lines are not tasks yet");
    assert_eq!(reread(&store, &batch).await.status, BatchStatus::Validating);

    let stored = store
        .start_batch(batch.started(time(10)))
        .await
        .unwrap()
        .expect("started");
    assert_eq!(stored.status, BatchStatus::InProgress);
    assert_eq!(stored.in_progress_at, Some(time(10)));
    assert_eq!(stored.counts, counts(3, 0, 0));
    assert_eq!(stored.metadata, batch.metadata);
    assert_eq!(reread(&store, &batch).await, stored);

    let expected = [first[0].clone(), first[1].clone(), again[1].clone()];
    for (index, kept) in expected.iter().enumerate() {
        let (task, events) = assert_log_consistent(&store, kept.id).await;
        assert_eq!(task.status, TaskStatus::Queued);
        assert_eq!(task.last_sequence_number, 1);
        assert_eq!(kinds(&events), vec![lmsp_domain::event::EventKind::Created]);
        assert_eq!(task.client_id, client);
        assert_eq!(task.spec, kept.spec);
        assert_eq!(task.owner, worker);
        assert_eq!(task.service_tier, kept.service_tier);
        assert_eq!(
            task.batch,
            Some(BatchLine {
                batch_id: batch.id,
                line: index as u32 + 1,
                custom_id: format!("request-{}", index + 1),
            })
        );
    }
    assert_eq!(
        store.task(again[0].id).await.unwrap(),
        None,
        "a line kept twice keeps its first task"
    );
    let listed = store
        .list_tasks(TaskFilter {
            client_id: Some(client),
            limit: 10,
            ..TaskFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 3);
    let by_batch = store.batch_tasks(batch.id, &[], 0, 10).await.unwrap();
    assert_eq!(
        by_batch.iter().map(|task| task.id).collect::<Vec<_>>(),
        expected.iter().map(|task| task.id).collect::<Vec<_>>()
    );
    // The tasks are ordinary work: a worker claims one.
    let claimed = store
        .claim(
            instance_id(),
            time(11),
            lmsp_domain::schedule::TierAging::from_millis(300_000).unwrap(),
        )
        .await
        .unwrap()
        .expect("a queued batch task");
    assert!(claimed.batch.is_some());

    assert_eq!(
        store.start_batch(batch.started(time(12))).await.unwrap(),
        None,
        "no longer validating"
    );
    assert_eq!(reread(&store, &batch).await.counts.total, 3);
    assert_eq!(
        store.batch_tasks(batch.id, &[], 0, 10).await.unwrap().len(),
        3
    );
}

/// P-2: a batch cancelled while it was validating never starts: its start creates none of its
/// kept lines and leaves it `cancelling` with no total.
pub async fn a_batch_cancelled_while_validating_starts_nothing_p2<F: StoreFactory>(factory: &F) {
    let (store, _) = fresh_store(factory).await;
    let client = client_id();
    let worker = instance_id();
    let batch = validating(&store, client).await;
    let tasks: Vec<Task> = (1..=2)
        .map(|line| line_task(&batch, line, worker))
        .collect();
    store.stage_batch_tasks(tasks.clone()).await.unwrap();
    let cancelling = store
        .update_batch(
            BatchStatus::Validating,
            batch.cancelled_by_client(time(5)).unwrap(),
        )
        .await
        .unwrap()
        .expect("a validating batch is cancelled");
    assert_eq!(cancelling.status, BatchStatus::Cancelling);
    assert_eq!(cancelling.cancelling_at, Some(time(5)));
    assert_eq!(
        store.start_batch(batch.started(time(10))).await.unwrap(),
        None
    );
    for task in &tasks {
        assert_eq!(store.task(task.id).await.unwrap(), None);
    }
    let stored = reread(&store, &batch).await;
    assert_eq!(stored.status, BatchStatus::Cancelling);
    assert_eq!(stored.counts, counts(0, 0, 0));
    assert!(store
        .batch_tasks(batch.id, &[], 0, 10)
        .await
        .unwrap()
        .is_empty());
}

/// `batch::counted`: a line counts once, when its task ends, in the same write: completed as
/// `completed`, failed as `failed`, cancelled (while queued, or acknowledged while running) as
/// `failed`; a cancel that only starts (`cancelling`) and a refused step count nothing.
pub async fn each_batch_line_counts_once_when_its_task_ends<F: StoreFactory>(factory: &F) {
    let (store, _) = fresh_store(factory).await;
    let worker = instance_id();
    let (batch, tasks) = started(&store, client_id(), 5, worker).await;
    assert_eq!(batch.counts, counts(5, 0, 0));

    let done = complete_line(&store, &tasks[0]).await;
    assert_eq!(reread(&store, &batch).await.counts, counts(5, 1, 0));
    refused(
        store
            .finish(
                done.id,
                worker,
                complete(&done, "again", time(22)),
                time(22),
            )
            .await
            .unwrap(),
    );
    assert_eq!(
        reread(&store, &batch).await.counts,
        counts(5, 1, 0),
        "a refused step counts nothing"
    );

    fail_line(&store, &tasks[1]).await;
    assert_eq!(reread(&store, &batch).await.counts, counts(5, 1, 1));

    decided(store.cancel(tasks[2].id, None, time(30)).await.unwrap());
    assert_eq!(
        store.task(tasks[2].id).await.unwrap().unwrap().status,
        TaskStatus::Cancelled
    );
    assert_eq!(
        reread(&store, &batch).await.counts,
        counts(5, 1, 2),
        "a cancelled queued line counts as failed"
    );

    let running = step(
        &store,
        &tasks[3],
        worker,
        vec![claim(&tasks[3]), Step::Loaded],
        None,
        time(31),
    )
    .await;
    let (_, cancelling) = decided(store.cancel(running.id, None, time(32)).await.unwrap());
    assert_eq!(cancelling.status, TaskStatus::Cancelling);
    assert_eq!(
        reread(&store, &batch).await.counts,
        counts(5, 1, 2),
        "a cancel under way counts nothing yet"
    );
    finish(&store, &cancelling, worker, Step::AcknowledgeCancel).await;
    assert_eq!(reread(&store, &batch).await.counts, counts(5, 1, 3));
    // A second cancel of an ended line changes nothing.
    decided(store.cancel(running.id, None, time(33)).await.unwrap());
    assert_eq!(reread(&store, &batch).await.counts, counts(5, 1, 3));

    complete_line(&store, &tasks[4]).await;
    let last = reread(&store, &batch).await;
    assert_eq!(last.counts, counts(5, 2, 3));
    assert!(last.counts.all_counted());
}

/// P-7, I-5, `batch::counted`: a line whose task recovery ends (a running or queued task of
/// policy `fail` whose instance stopped) counts as failed, in the recovery's write, and once.
pub async fn a_batch_line_recovery_fails_counts_as_failed_p7<F: StoreFactory>(factory: &F) {
    let (store, _) = fresh_store(factory).await;
    let gone = register(&store, "gone", time(0)).await.id;
    let (batch, tasks) = started(&store, client_id(), 2, gone).await;
    let running = step(
        &store,
        &tasks[0],
        gone,
        vec![claim(&tasks[0]), Step::Loaded],
        None,
        time(20),
    )
    .await;
    assert_eq!(running.on_restart, RestartPolicy::Fail);
    store.retire_instance(gone, time(30)).await.unwrap();
    let rescuer = register(&store, "rescuer", time(31)).await.id;
    store
        .recover_instance(gone, rescuer, time(32))
        .await
        .unwrap();
    assert_eq!(
        store.task(running.id).await.unwrap().unwrap().status,
        TaskStatus::Failed
    );
    // The queued line of policy `fail` that the stopped instance accepted fails too.
    assert_eq!(
        store.task(tasks[1].id).await.unwrap().unwrap().status,
        TaskStatus::Failed
    );
    assert_eq!(reread(&store, &batch).await.counts, counts(2, 0, 2));
    let again = store
        .recover_instance(gone, rescuer, time(33))
        .await
        .unwrap();
    assert_eq!(again, Default::default(), "I-5: nothing moves twice");
    assert_eq!(
        reread(&store, &batch).await.counts,
        counts(2, 0, 2),
        "each line counts once"
    );
}

/// A batch's step is a compare-and-set on its status: from a status it is not in, nothing is
/// written and `None` comes back; from its own, the step is written, and the counts stay the
/// store's whatever the written batch says.
pub async fn a_batch_step_is_a_compare_and_set_on_its_status<F: StoreFactory>(factory: &F) {
    let (store, _) = fresh_store(factory).await;
    let worker = instance_id();
    let (batch, tasks) = started(&store, client_id(), 2, worker).await;
    complete_line(&store, &tasks[0]).await;
    let before = reread(&store, &batch).await;

    assert_eq!(
        store
            .update_batch(BatchStatus::Validating, before.finalizing(false, time(40)))
            .await
            .unwrap(),
        None,
        "not validating"
    );
    assert_eq!(
        store
            .end_batch(
                BatchStatus::Finalizing,
                before.ended(None, None, time(40)),
                vec![output_file(&before, time(40))],
            )
            .await
            .unwrap(),
        None,
        "not finalizing"
    );
    assert_eq!(reread(&store, &batch).await, before, "nothing changed");
    assert!(store
        .list_files(
            None,
            Some(FilePurpose::BatchOutput),
            None,
            ListOrder::Desc,
            10
        )
        .await
        .unwrap()
        .items
        .is_empty());

    let mut cancelled = before.cancelled_by_client(time(41)).unwrap();
    cancelled.counts = counts(99, 99, 99);
    let stored = store
        .update_batch(BatchStatus::InProgress, cancelled)
        .await
        .unwrap()
        .expect("in progress");
    assert_eq!(stored.status, BatchStatus::Cancelling);
    assert_eq!(stored.cancelling_at, Some(time(41)));
    assert_eq!(stored.counts, counts(2, 1, 0), "the counts are the store's");
    assert_eq!(reread(&store, &batch).await, stored);
    assert_eq!(
        store
            .update_batch(
                BatchStatus::InProgress,
                before.cancelled_by_client(time(42)).unwrap()
            )
            .await
            .unwrap(),
        None,
        "a second cancel finds it cancelling"
    );
}

/// A refused batch keeps its line errors; an ended batch stores its output and error files'
/// records with its end, and reads back with them.
pub async fn a_batch_ends_with_its_files_and_keeps_its_errors<F: StoreFactory>(factory: &F) {
    let (store, _) = fresh_store(factory).await;
    let client = client_id();
    let worker = instance_id();

    let refused_batch = validating(&store, client).await;
    let errors = vec![
        LineError {
            code: LineErrorCode::DuplicateCustomId,
            message: String::from("the `custom_id` \"a\" is used by an earlier line"),
            param: Some(String::from("custom_id")),
            line: Some(2),
        },
        LineError {
            code: LineErrorCode::EmptyFile,
            message: String::from("no line"),
            param: None,
            line: None,
        },
    ];
    let failed = store
        .update_batch(
            BatchStatus::Validating,
            refused_batch.refused(errors.clone(), time(5)),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(failed.status, BatchStatus::Failed);
    assert_eq!(failed.errors, errors);
    assert_eq!(failed.failed_at, Some(time(5)));
    assert_eq!(reread(&store, &refused_batch).await, failed);

    let (batch, tasks) = started(&store, client, 2, worker).await;
    complete_line(&store, &tasks[0]).await;
    fail_line(&store, &tasks[1]).await;
    let counted = reread(&store, &batch).await;
    assert!(counted.counts.all_counted());
    let finalizing = store
        .update_batch(BatchStatus::InProgress, counted.finalizing(false, time(50)))
        .await
        .unwrap()
        .unwrap();
    let output = output_file(&batch, time(60));
    let error = StoredFile {
        filename: format!("{}_error.jsonl", batch.id),
        ..output_file(&batch, time(60))
    };
    let ended = store
        .end_batch(
            BatchStatus::Finalizing,
            finalizing.ended(Some(output.id), Some(error.id), time(60)),
            vec![output.clone(), error.clone()],
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ended.status, BatchStatus::Completed);
    assert_eq!(ended.completed_at, Some(time(60)));
    assert_eq!(ended.finalizing_at, Some(time(50)));
    assert_eq!(ended.output_file_id, Some(output.id));
    assert_eq!(ended.error_file_id, Some(error.id));
    assert_eq!(ended.counts, counts(2, 1, 1));
    assert_eq!(store.file(output.id).await.unwrap(), Some(output));
    assert_eq!(store.file(error.id).await.unwrap(), Some(error));
    assert_eq!(reread(&store, &batch).await, ended);
}

/// A batch's tasks read in line order after a line, a page at a time, and only in the statuses
/// asked for when some are.
pub async fn batch_tasks_page_in_line_order_and_filter_by_status<F: StoreFactory>(factory: &F) {
    let (store, _) = fresh_store(factory).await;
    let worker = instance_id();
    let (batch, tasks) = started(&store, client_id(), 5, worker).await;
    let (other, _) = started(&store, client_id(), 2, worker).await;
    complete_line(&store, &tasks[1]).await;
    complete_line(&store, &tasks[3]).await;
    let lines = |found: Vec<Task>| -> Vec<u32> {
        found
            .iter()
            .map(|task| {
                let line = task.batch.as_ref().expect("a batch line");
                assert_eq!(line.batch_id, batch.id);
                line.line
            })
            .collect()
    };
    assert_eq!(
        lines(store.batch_tasks(batch.id, &[], 0, 2).await.unwrap()),
        vec![1, 2]
    );
    assert_eq!(
        lines(store.batch_tasks(batch.id, &[], 2, 2).await.unwrap()),
        vec![3, 4]
    );
    assert_eq!(
        lines(store.batch_tasks(batch.id, &[], 4, 2).await.unwrap()),
        vec![5]
    );
    assert!(store
        .batch_tasks(batch.id, &[], 5, 2)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        lines(
            store
                .batch_tasks(batch.id, &[TaskStatus::Completed], 0, 10)
                .await
                .unwrap()
        ),
        vec![2, 4]
    );
    assert_eq!(
        lines(
            store
                .batch_tasks(batch.id, &[TaskStatus::Queued, TaskStatus::Running], 1, 10)
                .await
                .unwrap()
        ),
        vec![3, 5]
    );
    assert_eq!(
        store.batch_tasks(other.id, &[], 0, 10).await.unwrap().len(),
        2
    );
}

/// A batch's tasks read in line order a page at a time, each with its stored response: a
/// completed line's is the one `response` answers for its task, an unfinished or failed line
/// has none; another batch's lines are never among them.
pub async fn batch_answers_pair_each_line_with_its_response<F: StoreFactory>(factory: &F) {
    let (store, _) = fresh_store(factory).await;
    let worker = instance_id();
    let (batch, tasks) = started(&store, client_id(), 4, worker).await;
    let (other, other_tasks) = started(&store, client_id(), 2, worker).await;
    complete_line(&store, &tasks[0]).await;
    fail_line(&store, &tasks[2]).await;
    complete_line(&store, &tasks[3]).await;
    complete_line(&store, &other_tasks[0]).await;
    let first = store.batch_answers(batch.id, 0, 3).await.unwrap();
    let rest = store.batch_answers(batch.id, 3, 3).await.unwrap();
    let answers: Vec<_> = first.into_iter().chain(rest).collect();
    let lines: Vec<u32> = answers
        .iter()
        .map(|(task, _)| task.batch.as_ref().expect("a batch line").line)
        .collect();
    assert_eq!(lines, vec![1, 2, 3, 4]);
    for (task, response) in &answers {
        assert_eq!(*task, store.task(task.id).await.unwrap().expect("the task"));
        assert_eq!(*response, store.response(task.id).await.unwrap());
    }
    let answered: Vec<bool> = answers.iter().map(|(_, r)| r.is_some()).collect();
    assert_eq!(answered, vec![true, false, false, true]);
    assert!(store
        .batch_answers(batch.id, 4, 3)
        .await
        .unwrap()
        .is_empty());
    let others = store.batch_answers(other.id, 0, 10).await.unwrap();
    assert_eq!(others.len(), 2);
    assert!(others[0].1.is_some() && others[1].1.is_none());
}

/// I-7: batches are listed newest first, a client's only its own (the service's all), in pages
/// before an id; the unfinished ones are listed oldest first, an ended one not.
pub async fn batches_are_listed_newest_first_per_client_i7<F: StoreFactory>(factory: &F) {
    let (store, _) = fresh_store(factory).await;
    let (a, b) = (client_id(), client_id());
    let first = validating(&store, a).await;
    let theirs = validating(&store, b).await;
    let second = validating(&store, a).await;
    let third = validating(&store, a).await;
    store
        .update_batch(BatchStatus::Validating, second.refused(Vec::new(), time(3)))
        .await
        .unwrap()
        .unwrap();

    let page = store.list_batches(Some(a), None, 2).await.unwrap();
    assert_eq!(
        page.items.iter().map(|batch| batch.id).collect::<Vec<_>>(),
        vec![third.id, second.id]
    );
    assert!(page.has_more);
    let rest = store
        .list_batches(Some(a), Some(second.id), 2)
        .await
        .unwrap();
    assert_eq!(rest.items, vec![first.clone()]);
    assert!(!rest.has_more);
    assert_eq!(
        store
            .list_batches(None, None, 10)
            .await
            .unwrap()
            .items
            .len(),
        4
    );

    let unfinished = store.unfinished_batches(10).await.unwrap();
    assert_eq!(
        unfinished.iter().map(|batch| batch.id).collect::<Vec<_>>(),
        vec![first.id, theirs.id, third.id]
    );
    assert_eq!(store.unfinished_batches(1).await.unwrap(), vec![first]);
}

/// Ends `batch` (every line of it finished already) as completed at `at`, with an output file.
async fn end<S: Store + ?Sized>(store: &S, batch: &Batch, at: Timestamp) -> (Batch, StoredFile) {
    let counted = reread(store, batch).await;
    let finalizing = store
        .update_batch(BatchStatus::InProgress, counted.finalizing(false, at))
        .await
        .unwrap()
        .unwrap();
    let output = output_file(batch, at);
    let ended = store
        .end_batch(
            BatchStatus::Finalizing,
            finalizing.ended(Some(output.id), None, at),
            vec![output.clone()],
        )
        .await
        .unwrap()
        .unwrap();
    (ended, output)
}

/// P-5, P-6: the purge of batches removes a batch that ended before the cut-off with its tasks
/// (their logs and responses), at most `batch` tasks per call, saying whether more is left, then
/// its written files' records, which it returns; never a batch that has not ended, nor an
/// uploaded file.
pub async fn purging_batches_removes_only_ended_ones_with_their_tasks_and_files_p5_p6<
    F: StoreFactory,
>(
    factory: &F,
) {
    let (store, _) = fresh_store(factory).await;
    let worker = instance_id();
    let client = client_id();
    let (batch, tasks) = started(&store, client, 3, worker).await;
    for task in &tasks {
        complete_line(&store, task).await;
    }
    let (ended, output) = end(&store, &batch, time(100)).await;
    let (running, running_tasks) = started(&store, client, 2, worker).await;
    complete_line(&store, &running_tasks[0]).await;
    let waiting = validating(&store, client).await;

    let none = store.purge_batches(time(100), 10).await.unwrap();
    assert_eq!((none.batches, none.tasks, none.more), (0, 0, false));
    assert!(none.files.is_empty(), "ended at the cut-off, not before");

    let part = store.purge_batches(time(101), 2).await.unwrap();
    assert_eq!((part.batches, part.tasks, part.more), (0, 2, true));
    assert!(part.files.is_empty());
    assert_eq!(
        reread(&store, &batch).await,
        ended,
        "the batch waits for its last task"
    );
    let rest = store.purge_batches(time(101), 2).await.unwrap();
    assert_eq!((rest.batches, rest.tasks, rest.more), (1, 1, false));
    assert_eq!(rest.files, vec![output.id]);

    for task in &tasks {
        assert_eq!(store.task(task.id).await.unwrap(), None);
        assert!(store.response(task.id).await.unwrap().is_none());
        assert!(store.events(task.id, 0, 10).await.unwrap().items.is_empty());
    }
    assert_eq!(store.batch(batch.id).await.unwrap(), None);
    assert_eq!(store.file(output.id).await.unwrap(), None);
    assert!(
        store.file(batch.input_file_id).await.unwrap().is_some(),
        "an upload is never purged"
    );
    assert_eq!(
        reread(&store, &running).await.status,
        BatchStatus::InProgress
    );
    assert_eq!(
        store
            .batch_tasks(running.id, &[], 0, 10)
            .await
            .unwrap()
            .len(),
        2,
        "an unfinished batch keeps its tasks, finished or not"
    );
    assert_eq!(
        reread(&store, &waiting).await.status,
        BatchStatus::Validating
    );
    let after = store.purge_batches(time(10_000), 10).await.unwrap();
    assert_eq!((after.batches, after.tasks, after.more), (0, 0, false));
}

/// P-5: the purge of finished tasks leaves a batch's tasks alone, however old: they go with their
/// batch.
pub async fn purging_finished_tasks_leaves_batch_tasks_to_their_batch_p5<F: StoreFactory>(
    factory: &F,
) {
    let (store, _) = fresh_store(factory).await;
    let worker = instance_id();
    let (batch, tasks) = started(&store, client_id(), 2, worker).await;
    complete_line(&store, &tasks[0]).await;
    fail_line(&store, &tasks[1]).await;
    let alone = task_in(
        &store,
        task(worker, RestartPolicy::Fail),
        worker,
        TaskStatus::Completed,
    )
    .await;
    let report = store.purge_finished(time(1_000_000), 10).await.unwrap();
    assert_eq!(report.tasks, 1, "only the task of no batch");
    assert_eq!(store.task(alone.id).await.unwrap(), None);
    for task in &tasks {
        assert!(store.task(task.id).await.unwrap().is_some());
    }
    assert_eq!(reread(&store, &batch).await.counts, counts(2, 1, 1));
}

/// API §14, §16: a batch's lines do not count toward the queue limits (`max_queued` of a
/// client, `--max-queued` of the service), which bound the tasks submitted one by one: a queued
/// batch never makes another request 429 or 503. A batch is bounded by its lines.
pub async fn batch_lines_do_not_count_toward_the_queue_limits<F: StoreFactory>(factory: &F) {
    let (store, _) = fresh_store(factory).await;
    let worker = instance_id();
    let (client, _) = crate::fixtures::client(&[Scope::ResponsesWrite]);
    store.insert_client(client.clone()).await.unwrap();
    let limits = ClientLimits {
        max_running: None,
        max_queued: Some(1),
    };
    assert!(store.set_client_limits(client.id, limits).await.unwrap());
    let (_, lines) = started(&store, client.id, 3, worker).await;
    assert_eq!(lines.len(), 3);
    let direct = |worker| {
        let mut task = task(worker, RestartPolicy::Fail);
        task.client_id = client.id;
        task
    };
    let first = direct(worker);
    let outcome = store
        .create_task_within(first.clone(), None, Some(1))
        .await
        .unwrap();
    assert!(
        matches!(outcome, CreateOutcome::Created(_)),
        "3 batch lines queued, none submitted: {outcome:?}"
    );
    let second = direct(worker);
    let outcome = store
        .create_task_within(second.clone(), None, Some(5))
        .await
        .unwrap();
    assert_eq!(outcome, CreateOutcome::QueueFull(QueueFull::Client(1)));
    let outcome = store
        .create_task_within(second.clone(), None, Some(1))
        .await
        .unwrap();
    assert_eq!(outcome, CreateOutcome::QueueFull(QueueFull::Client(1)));
    let other = task(worker, RestartPolicy::Fail);
    let outcome = store
        .create_task_within(other.clone(), None, Some(1))
        .await
        .unwrap();
    assert_eq!(outcome, CreateOutcome::QueueFull(QueueFull::Service(1)));
    let outcome = store
        .create_task_within(other, None, Some(2))
        .await
        .unwrap();
    assert!(matches!(outcome, CreateOutcome::Created(_)), "{outcome:?}");
    assert_eq!(store.task(second.id).await.unwrap(), None);
}
