//! The hot reads on connections of their own, shared: a submit's token and model lookups, a
//! task's point read, and the event reads of streams.
//!
//! Each of a few connections is shared by every caller at once: tokio-postgres pipelines the
//! requests of concurrent callers on one connection (sent as they come, answered in order), so a
//! burst of reads is a few writes to one backend, which answers them back to back, instead of a
//! pooled connection, a backend woken and a round trip each. Each statement is prepared once per
//! connection. Every read still reads the database after its call began: nothing is cached.
//!
//! A submit's lookups and the event reads of streams are gathered ([`Gather`]): the reads of a
//! kind that queue while a statement answers earlier ones are one statement (`unnest` of what
//! they ask for), so a burst of submits costs the database one token statement and one model
//! statement per gathering, not two per submit ([`Tokens`], [`Models`]), and a notification
//! that wakes the streams of many tasks on an instance one query there, not one per stream
//! ([`Events`]: a `LATERAL` page of each task). A gathered read is still sent after its call
//! began, so it sees every commit made before (a token revoked on any instance fails at once,
//! I-7). The rows an event is rebuilt from (the task of `response.created`, the response of
//! `response.completed` and of a completed item's end) come in the same statement as the
//! events that need them: one statement, so one snapshot of the events and those rows.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use lmsp_domain::auth::{self, SecretHash};
use lmsp_domain::event::{Event, EventKind};
use lmsp_domain::ids::TaskId;
use lmsp_domain::model::{ModelId, ModelRecord};
use lmsp_domain::ports::Page;
use lmsp_domain::task::{Response, Task};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Config, NoTls, Row, Statement};

use crate::codec::{self, ClientRow, EventCode, EventRow, ModelRow, CLIENT_COLUMNS, MODEL_COLUMNS};
use crate::error::DbError;
use crate::ops::{self, decode_task, key, to_i64, Db, Res, TASK_COLUMNS, TASK_COLUMN_COUNT};

/// One shared connection: its client, the task driving it, and its prepared statements.
pub struct Conn {
    client: Client,
    driver: JoinHandle<()>,
    statements: Mutex<HashMap<String, Statement>>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl Conn {
    async fn statement(&self, sql: &str) -> Result<Statement, tokio_postgres::Error> {
        let known = self
            .statements
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(sql)
            .cloned();
        if let Some(statement) = known {
            return Ok(statement);
        }
        let statement = self.client.prepare(sql).await?;
        self.statements
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }
}

#[async_trait]
impl Db for Conn {
    async fn execute(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        let statement = self.statement(sql).await?;
        self.client.execute(&statement, params).await
    }

    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let statement = self.statement(sql).await?;
        self.client.query(&statement, params).await
    }

    async fn query_opt(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, tokio_postgres::Error> {
        let statement = self.statement(sql).await?;
        self.client.query_opt(&statement, params).await
    }
}

/// A few shared connections, opened when first needed and again after one closed.
pub struct Readers {
    config: Config,
    timeout: Duration,
    slots: Vec<tokio::sync::Mutex<Option<Arc<Conn>>>>,
    next: AtomicUsize,
}

impl Readers {
    /// `count` shared connections (at least one) to the database of `config`; opening one
    /// waits at most `timeout`.
    pub fn new(config: Config, count: usize, timeout: Duration) -> Readers {
        Readers {
            config,
            timeout,
            slots: (0..count.max(1))
                .map(|_| tokio::sync::Mutex::new(None))
                .collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// The next shared connection, round-robin (opened now if it is not open).
    pub async fn conn(&self) -> Result<Arc<Conn>, DbError> {
        let index = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        let mut slot = self.slots[index].lock().await;
        if let Some(conn) = slot.as_ref() {
            if !conn.client.is_closed() {
                return Ok(Arc::clone(conn));
            }
        }
        *slot = None;
        let (client, connection) = tokio::time::timeout(self.timeout, self.config.connect(NoTls))
            .await
            .map_err(|_| DbError::Pool(String::from("timed out connecting to PostgreSQL")))??;
        let driver = tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "a shared PostgreSQL read connection ended");
            }
        });
        let conn = Arc::new(Conn {
            client,
            driver,
            statements: Mutex::new(HashMap::new()),
        });
        *slot = Some(Arc::clone(&conn));
        Ok(conn)
    }

    /// Closes every shared connection.
    pub fn close(&self) {
        for slot in &self.slots {
            if let Ok(mut slot) = slot.try_lock() {
                *slot = None;
            }
        }
    }
}

/// A kind of read that is gathered: the reads of that kind that queue while one statement
/// answers earlier ones are read together, as one statement on one shared connection.
#[async_trait]
pub trait Reading: Send + Sync + 'static {
    /// What one read asks for.
    type Key: Send + Sync + 'static;
    /// What one read answers.
    type Value: Send + 'static;
    /// Reads every key's value in one statement on `conn`, in the order of `keys`.
    async fn read(&self, conn: &Conn, keys: &[Self::Key]) -> Res<Vec<Res<Self::Value>>>;
}

/// One read waiting to be gathered, and who waits for its answer.
struct Wanted<R: Reading> {
    key: R::Key,
    answer: oneshot::Sender<Res<R::Value>>,
}

/// The reads of one kind gathered: a gatherer per shared connection takes whatever has queued
/// (at most [`MAX_GATHERED`]) and reads it in one statement, so a burst of reads costs the
/// database a statement per gathering instead of one per read.
pub struct Gather<R: Reading> {
    queue: mpsc::UnboundedSender<Wanted<R>>,
    gatherers: Vec<JoinHandle<()>>,
}

/// Reads gathered into one statement at most.
const MAX_GATHERED: usize = 256;

impl<R: Reading> Gather<R> {
    /// Starts a gatherer of `reading` per shared connection of `readers`.
    pub fn start(readers: Arc<Readers>, reading: R) -> Gather<R> {
        let (queue, pending) = mpsc::unbounded_channel::<Wanted<R>>();
        let pending = Arc::new(tokio::sync::Mutex::new(pending));
        let reading = Arc::new(reading);
        let gatherers = (0..readers.slots.len())
            .map(|_| {
                let (readers, pending) = (Arc::clone(&readers), Arc::clone(&pending));
                let reading = Arc::clone(&reading);
                tokio::spawn(async move {
                    loop {
                        let mut wanted = Vec::new();
                        {
                            let mut pending = pending.lock().await;
                            match pending.recv().await {
                                Some(first) => wanted.push(first),
                                None => return,
                            }
                            while wanted.len() < MAX_GATHERED {
                                match pending.try_recv() {
                                    Ok(next) => wanted.push(next),
                                    Err(_) => break,
                                }
                            }
                        }
                        gathered(&readers, reading.as_ref(), wanted).await;
                    }
                })
            })
            .collect();
        Gather { queue, gatherers }
    }

    /// The value of `key`, read with the reads of its kind gathered meanwhile.
    pub async fn get(&self, key: R::Key) -> Res<R::Value> {
        let (answer, answered) = oneshot::channel();
        self.queue
            .send(Wanted { key, answer })
            .map_err(|_| DbError::Pool(String::from("the store is closed")))?;
        answered
            .await
            .unwrap_or_else(|_| Err(DbError::Pool(String::from("a gathered read was lost"))))
    }

    /// Stops the gatherers.
    pub fn stop(&self) {
        for gatherer in &self.gatherers {
            gatherer.abort();
        }
    }
}

/// Reads `wanted` in one statement and answers each: when the statement fails, every read
/// fails with its error.
async fn gathered<R: Reading>(readers: &Readers, reading: &R, wanted: Vec<Wanted<R>>) {
    let (keys, answers): (Vec<R::Key>, Vec<_>) =
        wanted.into_iter().map(|one| (one.key, one.answer)).unzip();
    let read = async {
        let conn = readers.conn().await?;
        reading.read(conn.as_ref(), &keys).await
    };
    match read.await {
        Ok(values) if values.len() == answers.len() => {
            for (answer, value) in answers.into_iter().zip(values) {
                let _ = answer.send(value);
            }
        }
        Ok(values) => {
            let text = format!("{} values read for {} reads", values.len(), answers.len());
            for answer in answers {
                let _ = answer.send(Err(ops::corrupt(text.clone())));
            }
        }
        Err(error) => {
            let text = error.to_string();
            let mut first = Some(error);
            for answer in answers {
                let error = first.take().unwrap_or_else(|| DbError::Pool(text.clone()));
                let _ = answer.send(Err(error));
            }
        }
    }
}

/// The gathered reads of a store: stream pages, token lookups, model lookups.
pub struct Gathers {
    /// Pages of a task's events.
    pub events: Gather<Events>,
    /// The client of a token.
    pub tokens: Gather<Tokens>,
    /// A model by id.
    pub models: Gather<Models>,
}

impl Gathers {
    /// Starts the gatherers of each kind on the shared connections of `readers`.
    pub fn start(readers: &Arc<Readers>) -> Gathers {
        Gathers {
            events: Gather::start(Arc::clone(readers), Events),
            tokens: Gather::start(Arc::clone(readers), Tokens),
            models: Gather::start(Arc::clone(readers), Models),
        }
    }

    /// Stops every gatherer.
    pub fn stop(&self) {
        self.events.stop();
        self.tokens.stop();
        self.models.stop();
    }
}

/// A submit's token lookup: the unrevoked client of a token's hash.
pub struct Tokens;

/// The unrevoked client of each wanted hash (`w.i`, last, after [`CLIENT_COLUMNS`]: its
/// place in the array, from 1); a hash no such client has has no row.
static TOKENS_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {CLIENT_COLUMNS}, w.i FROM unnest($1::text[]) WITH ORDINALITY AS w(hash, i) \
         JOIN clients ON token_hash = w.hash AND revoked_at IS NULL"
    )
});

#[async_trait]
impl Reading for Tokens {
    type Key = SecretHash;
    type Value = Option<auth::Client>;

    async fn read(&self, conn: &Conn, keys: &[SecretHash]) -> Res<Vec<Res<Option<auth::Client>>>> {
        let hashes: Vec<String> = keys.iter().map(SecretHash::to_hex).collect();
        let rows = conn.query(TOKENS_SQL.as_str(), &[&hashes]).await?;
        by_place(&rows, keys.len(), |row| {
            ops::read::<ClientRow>(row)?.decode().map_err(DbError::from)
        })
    }
}

/// A submit's model lookup: a model by id.
pub struct Models;

/// Each wanted model (`w.i`, last, after [`MODEL_COLUMNS`]: its place in the array,
/// from 1); an id
/// no model has has no row.
static MODELS_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {MODEL_COLUMNS}, w.i FROM unnest($1::text[]) WITH ORDINALITY AS w(wanted, i) \
         JOIN models ON id = w.wanted"
    )
});

#[async_trait]
impl Reading for Models {
    type Key = ModelId;
    type Value = Option<ModelRecord>;

    async fn read(&self, conn: &Conn, keys: &[ModelId]) -> Res<Vec<Res<Option<ModelRecord>>>> {
        let ids: Vec<&str> = keys.iter().map(ModelId::as_str).collect();
        let rows = conn.query(MODELS_SQL.as_str(), &[&ids]).await?;
        by_place(&rows, keys.len(), |row| {
            ops::read::<ModelRow>(row)?.decode().map_err(DbError::from)
        })
    }
}

/// The rows of a gathered lookup as one answer per wanted key: the row whose place (its last
/// column, from 1) is the key's, decoded, or `None` when there is none.
fn by_place<T>(
    rows: &[Row],
    wanted: usize,
    decode: impl Fn(&Row) -> Res<T>,
) -> Res<Vec<Res<Option<T>>>> {
    let mut values: Vec<Res<Option<T>>> = (0..wanted).map(|_| Ok(None)).collect();
    for row in rows {
        let place = row.len().saturating_sub(1);
        *slot(&mut values, row.try_get(place)?)? = decode(row).map(Some);
    }
    Ok(values)
}

/// The answer of the read at `place` (from 1, as `WITH ORDINALITY` numbers them) among
/// `answers`.
fn slot<T>(answers: &mut [T], place: i64) -> Res<&mut T> {
    usize::try_from(place - 1)
        .ok()
        .and_then(|index| answers.get_mut(index))
        .ok_or_else(|| ops::corrupt(format!("a gathered read's place {place}")))
}

/// The event reads of streams (see the module's documentation): a page of a task's events
/// after a sequence number, at most a number of them.
pub struct Events;

/// Every wanted page's rows, ordered by wanted page then sequence number: the task's columns
/// ([`TASK_COLUMNS`], only beside a `response.created`), `r.i` the page's place in the arrays
/// (from 1), the event's columns, and the task's response (only beside an event rebuilt from
/// it, as [`EventRow::needs`] says). `OFFSET 0` keeps those two subqueries per row (index
/// probes behind a one-time filter on the event's kind); pulled up, the planner would join
/// whole tables.
static GATHERED_SQL: LazyLock<String> = LazyLock::new(|| {
    let created = EventCode::of(EventKind::Created);
    let completed = EventCode::of(EventKind::Completed);
    let closed = [
        EventKind::OutputTextDone,
        EventKind::ContentPartDone,
        EventKind::OutputItemDone,
    ]
    .map(|kind| EventCode::of(kind).to_string())
    .join(", ");
    format!(
        "SELECT tk.*, r.i, e.sequence_number, e.kind, e.created_at, e.data, e.item, rs.doc \
         FROM unnest($1::bytea[], $2::bigint[], $3::bigint[]) WITH ORDINALITY \
            AS r(task_id, after, lim, i) \
         CROSS JOIN LATERAL (SELECT sequence_number, kind, created_at, data, item \
            FROM task_events WHERE task_id = r.task_id AND sequence_number > r.after \
            ORDER BY sequence_number LIMIT r.lim) e \
         LEFT JOIN LATERAL (SELECT {TASK_COLUMNS} FROM tasks t \
            JOIN task_specs s ON s.task_id = t.id \
            WHERE t.id = r.task_id AND e.kind = {created} OFFSET 0) tk ON TRUE \
         LEFT JOIN LATERAL (SELECT doc FROM responses WHERE task_id = r.task_id \
            AND (e.kind = {completed} OR (e.kind IN ({closed}) AND e.data = '')) OFFSET 0) rs \
            ON TRUE \
         ORDER BY r.i, e.sequence_number"
    )
});

#[async_trait]
impl Reading for Events {
    type Key = (TaskId, u64, usize);
    type Value = Page<Event>;

    async fn read(&self, conn: &Conn, keys: &[(TaskId, u64, usize)]) -> Res<Vec<Res<Page<Event>>>> {
        let mut tasks = Vec::with_capacity(keys.len());
        let mut afters = Vec::with_capacity(keys.len());
        let mut limits = Vec::with_capacity(keys.len());
        for &(task_id, after, limit) in keys {
            tasks.push(key(task_id));
            // Sequence numbers fit in i64; an `after` past that has nothing after it.
            afters.push(i64::try_from(after).unwrap_or(i64::MAX));
            limits.push(to_i64(limit as u64 + 1)?);
        }
        let rows = conn
            .query(GATHERED_SQL.as_str(), &[&tasks, &afters, &limits])
            .await?;
        let mut pages: Vec<Gathered> = keys.iter().map(|_| Gathered::default()).collect();
        for row in &rows {
            if let Err(error) = gather_row(row, &mut pages) {
                // A row that makes no sense fails every page read with it.
                let text = error.to_string();
                return Ok(keys.iter().map(|_| Err(ops::corrupt(&text))).collect());
            }
        }
        Ok(keys
            .iter()
            .zip(pages)
            .map(|(&(task_id, _, limit), page)| page.into_page(task_id, limit))
            .collect())
    }
}

/// One wanted page as read: its event rows, and the rows they are rebuilt from.
#[derive(Default)]
struct Gathered {
    rows: Vec<EventRow<'static>>,
    task: Option<Task>,
    response: Option<Response>,
}

/// Adds one row of [`GATHERED_SQL`] to its page.
fn gather_row(row: &Row, pages: &mut [Gathered]) -> Res<()> {
    let at = TASK_COLUMN_COUNT;
    let page = slot(pages, row.try_get(at)?)?;
    if row.try_get::<_, Option<Vec<u8>>>(0)?.is_some() {
        page.task = Some(decode_task(row)?);
    }
    if let Some(doc) = row.try_get::<_, Option<String>>(at + 6)? {
        page.response = Some(codec::response_from_text(&doc)?);
    }
    page.rows.push(EventRow {
        sequence_number: row.try_get(at + 1)?,
        code: row.try_get(at + 2)?,
        created_at: row.try_get(at + 3)?,
        data: row.try_get::<_, String>(at + 4)?.into(),
        item: row.try_get(at + 5)?,
    });
    Ok(())
}

impl Gathered {
    /// The page (at most `limit` of the rows, `limit` + 1 read), rebuilt with its rows.
    fn into_page(self, task_id: TaskId, limit: usize) -> Res<Page<Event>> {
        let (task, response) = (self.task.as_ref(), self.response.as_ref());
        Ok(codec::events_page(
            self.rows, task_id, limit, task, response,
        )?)
    }
}
