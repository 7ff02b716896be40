//! The list reads both adapters build from a filter at run time (tasks, files, batches, a
//! batch's tasks): which conditions a filter adds, in which order, and the values they bind,
//! written once with PostgreSQL's `$N` placeholders (the SQLite adapter runs them through
//! [`crate::sql::for_sqlite`]). Binding a [`Param`] stays each adapter's: the drivers want
//! different Rust types, and only the adapter knows them.

use lmsp_domain::batch::FilePurpose;
use lmsp_domain::ids::{BatchId, ClientId, FileId};
use lmsp_domain::ports::{ListOrder, TaskFilter};
use lmsp_domain::status::TaskStatus;

use crate::batches::{batch_key, file_key, BATCH_COLUMNS, FILE_COLUMNS};
use crate::rows::{key_of, to_i64, TASK_COLUMNS, TASK_FROM};
use crate::DbError;

/// A value bound to a statement built at run time, in the stored form of its column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Param {
    /// A key (`BLOB` / `bytea`).
    Blob(Vec<u8>),
    /// A name or a status (`TEXT`).
    Text(String),
    /// A count, a line or a limit (`INTEGER` / `bigint`).
    Integer(i64),
    /// An attempt count, an HTTP status or a limit (`INTEGER` / `integer`): PostgreSQL takes a
    /// 32-bit value for it.
    Int4(i32),
    /// `NULL`, of its column's kind: PostgreSQL checks a value's type even when it is `NULL`.
    Null(Kind),
}

/// The kind of a column a `NULL` is bound to ([`Param::Null`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `BLOB` / `bytea`.
    Blob,
    /// `TEXT`.
    Text,
    /// `INTEGER` / `bigint`.
    Integer,
    /// `INTEGER` / `integer`.
    Int4,
}

impl Param {
    /// A key or bytes that may be `NULL`.
    pub fn blob_or_null(value: Option<Vec<u8>>) -> Self {
        value.map_or(Param::Null(Kind::Blob), Param::Blob)
    }

    /// A text that may be `NULL`.
    pub fn text_or_null(value: Option<String>) -> Self {
        value.map_or(Param::Null(Kind::Text), Param::Text)
    }

    /// A 64-bit integer (a time, a size) that may be `NULL`.
    pub fn integer_or_null(value: Option<i64>) -> Self {
        value.map_or(Param::Null(Kind::Integer), Param::Integer)
    }

    /// A value of an `integer` column, `what` naming it should it be out of that column's range
    /// (a corrupt value: PostgreSQL could not store it).
    pub fn int4(value: i64, what: &str) -> Result<Self, DbError> {
        i32::try_from(value)
            .map(Param::Int4)
            .map_err(|_| crate::corrupt(format!("{what} {value} is out of range")))
    }

    /// [`Param::int4`] for a value that may be `NULL`.
    pub fn int4_or_null(value: Option<i64>, what: &str) -> Result<Self, DbError> {
        value.map_or(Ok(Param::Null(Kind::Int4)), |value| {
            Param::int4(value, what)
        })
    }
}

/// A statement built at run time and the values of its placeholders, `$1` first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// The statement, with `$N` placeholders.
    pub sql: String,
    /// The value of `$N` at index `N - 1`.
    pub params: Vec<Param>,
}

impl Query {
    /// `SELECT {columns} FROM {from} WHERE TRUE`, and `AND {client_column} = $1` when the list
    /// is one client's (I-7).
    fn select(columns: &str, from: &str, client_column: &str, client: Option<ClientId>) -> Self {
        let mut query = Self {
            sql: format!("SELECT {columns} FROM {from} WHERE TRUE"),
            params: Vec::new(),
        };
        if let Some(client) = client {
            let key = Param::Blob(key_of(client.ulid()).to_vec());
            query.and(client_column, "=", key);
        }
        query
    }

    /// The next placeholder, bound to `value`.
    fn bind(&mut self, value: Param) -> String {
        self.params.push(value);
        format!("${}", self.params.len())
    }

    /// Adds `AND {column} {op} $N`. An integer is compared as a `bigint` (`CAST`), so that
    /// PostgreSQL takes the value bound for it whatever the column's width (`batch_line` is an
    /// `integer`), and a value past every stored one simply matches nothing.
    fn and(&mut self, column: &str, op: &str, value: Param) {
        let is_integer = matches!(value, Param::Integer(_));
        let mark = self.bind(value);
        let operand = if is_integer {
            format!("CAST({mark} AS BIGINT)")
        } else {
            mark
        };
        self.sql.push_str(&format!(" AND {column} {op} {operand}"));
    }

    /// Adds `AND t.status IN (…)` unless `statuses` is empty (then every status passes).
    fn and_status_in(&mut self, statuses: &[TaskStatus]) {
        if statuses.is_empty() {
            return;
        }
        let marks: Vec<String> = statuses
            .iter()
            .map(|status| self.bind(Param::Text(status.as_str().to_owned())))
            .collect();
        self.sql
            .push_str(&format!(" AND t.status IN ({})", marks.join(", ")));
    }

    /// Ends the statement with its order and `LIMIT`.
    fn order_limit(mut self, order: &str, limit: usize) -> Result<Self, DbError> {
        let mark = self.bind(Param::Integer(to_i64(limit as u64)?));
        self.sql
            .push_str(&format!(" ORDER BY {order} LIMIT {mark}"));
        Ok(self)
    }
}

/// Tasks, newest first, as `filter` says; one more than its limit, so the page knows whether
/// there are more.
pub fn tasks_page(filter: &TaskFilter) -> Result<Query, DbError> {
    let mut query = Query::select(TASK_COLUMNS, TASK_FROM, "t.client_id", filter.client_id);
    query.and_status_in(&filter.statuses);
    if let Some(model) = &filter.model {
        query.and("t.model", "=", Param::Text(model.as_str().to_owned()));
    }
    if let Some(before) = filter.before {
        query.and("t.id", "<", Param::Blob(key_of(before.ulid()).to_vec()));
    }
    query.order_limit("t.id DESC", filter.limit + 1)
}

/// Files in id `order` (oldest or newest first), past `after` in that order, of `client` (I-7)
/// and with `purpose` when given; one more than `limit`.
pub fn files_page(
    client: Option<ClientId>,
    purpose: Option<FilePurpose>,
    after: Option<FileId>,
    order: ListOrder,
    limit: usize,
) -> Result<Query, DbError> {
    let mut query = Query::select(FILE_COLUMNS, "files", "client_id", client);
    if let Some(purpose) = purpose {
        query.and("purpose", "=", Param::Text(purpose.as_str().to_owned()));
    }
    let (past, by) = match order {
        ListOrder::Asc => (">", "id"),
        ListOrder::Desc => ("<", "id DESC"),
    };
    if let Some(after) = after {
        query.and("id", past, Param::Blob(file_key(after).to_vec()));
    }
    query.order_limit(by, limit + 1)
}

/// Batches, newest first, before `before`, of `client` when given (I-7); one more than `limit`.
pub fn batches_page(
    client: Option<ClientId>,
    before: Option<BatchId>,
    limit: usize,
) -> Result<Query, DbError> {
    let mut query = Query::select(BATCH_COLUMNS, "batches", "client_id", client);
    if let Some(before) = before {
        query.and("id", "<", Param::Blob(batch_key(before).to_vec()));
    }
    query.order_limit("id DESC", limit + 1)
}

/// A batch's tasks in line order after line `after`, at most `limit`, in one of `statuses` when
/// some are given.
pub fn batch_tasks(
    batch: BatchId,
    statuses: &[TaskStatus],
    after: u32,
    limit: usize,
) -> Result<Query, DbError> {
    let mut query = Query::select(TASK_COLUMNS, TASK_FROM, "t.client_id", None);
    query.and("t.batch_id", "=", Param::Blob(batch_key(batch).to_vec()));
    query.and("t.batch_line", ">", Param::Integer(i64::from(after)));
    query.and_status_in(statuses);
    query.order_limit("t.batch_line", limit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmsp_domain::ids::TaskId;
    use lmsp_domain::model::ModelId;
    use ulid::Ulid;

    fn ulid(n: u128) -> Ulid {
        Ulid::from_parts(1, n)
    }

    #[test]
    fn an_empty_filter_binds_only_the_limit_plus_one() {
        let query = tasks_page(&TaskFilter {
            limit: 20,
            ..TaskFilter::default()
        })
        .expect("query");
        assert!(
            query
                .sql
                .ends_with("WHERE TRUE ORDER BY t.id DESC LIMIT $1"),
            "{}",
            query.sql
        );
        assert_eq!(query.params, vec![Param::Integer(21)]);
    }

    #[test]
    fn each_condition_binds_its_value_at_its_own_placeholder() {
        let client = ClientId::from_ulid(ulid(1));
        let before = TaskId::from_ulid(ulid(2));
        let query = tasks_page(&TaskFilter {
            client_id: Some(client),
            statuses: vec![TaskStatus::Queued, TaskStatus::Running],
            model: ModelId::parse("m").ok(),
            before: Some(before),
            limit: 5,
        })
        .expect("query");
        assert!(
            query.sql.ends_with(
                "WHERE TRUE AND t.client_id = $1 AND t.status IN ($2, $3) AND t.model = $4 \
                 AND t.id < $5 ORDER BY t.id DESC LIMIT $6"
            ),
            "{}",
            query.sql
        );
        assert_eq!(
            query.params,
            vec![
                Param::Blob(client.ulid().to_bytes().to_vec()),
                Param::Text("queued".to_owned()),
                Param::Text("running".to_owned()),
                Param::Text("m".to_owned()),
                Param::Blob(before.ulid().to_bytes().to_vec()),
                Param::Integer(6),
            ]
        );
    }

    #[test]
    fn a_batchs_tasks_bind_after_the_batch_and_its_line() {
        let batch = BatchId::from_ulid(ulid(3));
        let query = batch_tasks(batch, &[TaskStatus::Completed], 7, 10).expect("query");
        assert!(
            query.sql.ends_with(
                "WHERE TRUE AND t.batch_id = $1 AND t.batch_line > CAST($2 AS BIGINT) \
                 AND t.status IN ($3) \
                 ORDER BY t.batch_line LIMIT $4"
            ),
            "{}",
            query.sql
        );
        assert_eq!(query.params.len(), 4);
        assert_eq!(query.params[1], Param::Integer(7));
        assert_eq!(query.params[3], Param::Integer(10));
    }

    #[test]
    fn files_continue_past_their_cursor_in_the_order_asked_for() {
        let after = Some(FileId::from_ulid(ulid(7)));
        let asc = files_page(None, None, after, ListOrder::Asc, 4).expect("query");
        assert!(
            asc.sql
                .ends_with("WHERE TRUE AND id > $1 ORDER BY id LIMIT $2"),
            "{}",
            asc.sql
        );
        let desc = files_page(None, None, after, ListOrder::Desc, 4).expect("query");
        assert!(
            desc.sql
                .ends_with("WHERE TRUE AND id < $1 ORDER BY id DESC LIMIT $2"),
            "{}",
            desc.sql
        );
        assert_eq!(desc.params[1], Param::Integer(5));
    }

    #[test]
    fn the_pages_read_the_same_in_sqlite() {
        let queries = [
            (
                files_page(
                    Some(ClientId::from_ulid(ulid(4))),
                    None,
                    Some(FileId::from_ulid(ulid(5))),
                    ListOrder::Asc,
                    3,
                ),
                3,
            ),
            (batches_page(None, Some(BatchId::from_ulid(ulid(6))), 3), 2),
        ];
        for (query, bound) in queries {
            let query = query.expect("query");
            let sqlite = crate::sql::for_sqlite(&query.sql);
            assert!(!sqlite.contains('$'), "{sqlite}");
            assert!(sqlite.contains(&format!("?{bound}")), "{sqlite}");
            assert_eq!(query.params.len(), bound);
        }
    }
}
