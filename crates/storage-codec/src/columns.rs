//! Reading a result row into the codec's row types, column by column, written once beside the
//! `*_COLUMNS` lists the rows are selected with: each adapter only says how its driver hands over
//! one value of a kind ([`Columns`], implemented once per driver), and every row type reads itself
//! ([`ReadRow`]), so a column's position is never written twice.

use crate::batches::{BatchRow, FileRow};
use crate::records::{ClientRow, IdempotencyRow, ModelRow};
use crate::rows::TaskRow;
use crate::webhooks::{DeliveryRow, EndpointRow};

/// One row of a result as a driver hands it over, read a value at a time by its column's
/// position. An integer reads from a column of any width (PostgreSQL keeps some in `smallint` or
/// `integer`, SQLite every one as `INTEGER`).
pub trait Columns {
    /// The driver's error for a value that is missing or not of the kind asked for.
    type Error;
    /// A `BLOB` (`bytea`).
    fn bytes(&self, index: usize) -> Result<Vec<u8>, Self::Error>;
    /// A `BLOB` (`bytea`) that may be `NULL`.
    fn bytes_or_null(&self, index: usize) -> Result<Option<Vec<u8>>, Self::Error>;
    /// A `TEXT`.
    fn text(&self, index: usize) -> Result<String, Self::Error>;
    /// A `TEXT` that may be `NULL`.
    fn text_or_null(&self, index: usize) -> Result<Option<String>, Self::Error>;
    /// An integer.
    fn int(&self, index: usize) -> Result<i64, Self::Error>;
    /// An integer that may be `NULL`.
    fn int_or_null(&self, index: usize) -> Result<Option<i64>, Self::Error>;
    /// A boolean (SQLite's `0`/`1`).
    fn flag(&self, index: usize) -> Result<bool, Self::Error>;
}

/// A stored row that reads itself from a result row selected with its `*_COLUMNS`.
pub trait ReadRow: Sized {
    /// The row, its values taken in the order of its columns list.
    fn read<C: Columns>(row: &C) -> Result<Self, C::Error>;
}

/// [`crate::TASK_COLUMNS`].
impl ReadRow for TaskRow {
    fn read<C: Columns>(row: &C) -> Result<Self, C::Error> {
        Ok(TaskRow {
            id: row.bytes(0)?,
            client_id: row.bytes(1)?,
            status: row.text(2)?,
            model: row.text(3)?,
            on_restart: row.text(4)?,
            created_at: row.int(5)?,
            started_at: row.int_or_null(6)?,
            finished_at: row.int_or_null(7)?,
            last_sequence_number: row.int(8)?,
            restarts: row.int(9)?,
            error: row.text_or_null(10)?,
            response_id: row.text_or_null(11)?,
            owner: row.bytes(12)?,
            background: row.flag(13)?,
            items_opened: row.int(14)?,
            item_open: row.flag(15)?,
            spec: row.text(16)?,
            metadata: row.text(17)?,
            accepted_by: row.bytes_or_null(18)?,
            tier: row.int(19)?,
            batch_id: row.bytes_or_null(20)?,
            batch_line: row.int_or_null(21)?,
            custom_id: row.text_or_null(22)?,
        })
    }
}

/// [`crate::CLIENT_COLUMNS`].
impl ReadRow for ClientRow {
    fn read<C: Columns>(row: &C) -> Result<Self, C::Error> {
        Ok(ClientRow {
            id: row.text(0)?,
            name: row.text(1)?,
            token_hash: row.text(2)?,
            scopes: row.text(3)?,
            created_at: row.int(4)?,
            revoked_at: row.int_or_null(5)?,
        })
    }
}

/// [`crate::MODEL_COLUMNS`].
impl ReadRow for ModelRow {
    fn read<C: Columns>(row: &C) -> Result<Self, C::Error> {
        Ok(ModelRow {
            id: row.text(0)?,
            format: row.text(1)?,
            path: row.text_or_null(2)?,
            size_bytes: row.int_or_null(3)?,
            modified_millis: row.int_or_null(4)?,
            digest: row.text_or_null(5)?,
            upstream_model: row.text_or_null(6)?,
            created_at: row.int(7)?,
        })
    }
}

/// [`crate::IDEMPOTENCY_COLUMNS`].
impl ReadRow for IdempotencyRow {
    fn read<C: Columns>(row: &C) -> Result<Self, C::Error> {
        Ok(IdempotencyRow {
            digest: row.bytes(0)?,
            reply: row.bytes_or_null(1)?,
            reply_task: row.bytes_or_null(2)?,
            held_until: row.int_or_null(3)?,
            held_by: row.bytes_or_null(4)?,
            created_at: row.int(5)?,
            expires_at: row.int(6)?,
        })
    }
}

/// [`crate::FILE_COLUMNS`].
impl ReadRow for FileRow {
    fn read<C: Columns>(row: &C) -> Result<Self, C::Error> {
        Ok(FileRow {
            id: row.bytes(0)?,
            client_id: row.bytes(1)?,
            filename: row.text(2)?,
            purpose: row.text(3)?,
            bytes: row.int(4)?,
            digest: row.text(5)?,
            created_at: row.int(6)?,
            batch_id: row.bytes_or_null(7)?,
        })
    }
}

/// [`crate::BATCH_COLUMNS`].
impl ReadRow for BatchRow {
    fn read<C: Columns>(row: &C) -> Result<Self, C::Error> {
        Ok(BatchRow {
            id: row.bytes(0)?,
            client_id: row.bytes(1)?,
            endpoint: row.text(2)?,
            input_file_id: row.bytes(3)?,
            completion_window: row.int(4)?,
            status: row.text(5)?,
            output_file_id: row.bytes_or_null(6)?,
            error_file_id: row.bytes_or_null(7)?,
            errors: row.text_or_null(8)?,
            total: row.int(9)?,
            completed: row.int(10)?,
            failed: row.int(11)?,
            metadata: row.text(12)?,
            created_at: row.int(13)?,
            times: [
                row.int_or_null(14)?,
                row.int_or_null(15)?,
                row.int_or_null(16)?,
                row.int_or_null(17)?,
                row.int_or_null(18)?,
                row.int_or_null(19)?,
                row.int_or_null(20)?,
            ],
        })
    }
}

/// [`crate::ENDPOINT_COLUMNS`].
impl ReadRow for EndpointRow {
    fn read<C: Columns>(row: &C) -> Result<Self, C::Error> {
        Ok(EndpointRow {
            id: row.bytes(0)?,
            name: row.text(1)?,
            url: row.text(2)?,
            event_types: row.text(3)?,
            secret: row.text(4)?,
            previous_secret: row.text_or_null(5)?,
            previous_valid_until: row.int_or_null(6)?,
            created_at: row.int(7)?,
            updated_at: row.int(8)?,
        })
    }
}

/// [`crate::DELIVERY_COLUMNS`].
impl ReadRow for DeliveryRow {
    fn read<C: Columns>(row: &C) -> Result<Self, C::Error> {
        Ok(DeliveryRow {
            endpoint_id: row.bytes(0)?,
            event_id: row.text(1)?,
            event_type: row.text(2)?,
            subject: row.bytes(3)?,
            created_at: row.int(4)?,
            attempts: row.int(5)?,
            next_attempt_at: row.int_or_null(6)?,
            last_status: row.int_or_null(7)?,
            last_error: row.text_or_null(8)?,
            last_attempt_at: row.int_or_null(9)?,
            delivered_at: row.int_or_null(10)?,
            given_up_at: row.int_or_null(11)?,
        })
    }
}

/// A read of one `TEXT` column (a `service_config` value, a code's scopes).
impl ReadRow for String {
    fn read<C: Columns>(row: &C) -> Result<Self, C::Error> {
        row.text(0)
    }
}

/// A read of one bytes column (a key).
impl ReadRow for Vec<u8> {
    fn read<C: Columns>(row: &C) -> Result<Self, C::Error> {
        row.bytes(0)
    }
}

/// A read of one integer column (`SELECT 1 …`: whether a row exists).
impl ReadRow for i64 {
    fn read<C: Columns>(row: &C) -> Result<Self, C::Error> {
        row.int(0)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::convert::Infallible;

    use super::*;

    /// A row that hands over an empty value of whatever kind is asked, noting which column was.
    #[derive(Default)]
    struct Probe(RefCell<Vec<usize>>);

    impl Probe {
        fn note(&self, index: usize) {
            self.0.borrow_mut().push(index);
        }
    }

    impl Columns for Probe {
        type Error = Infallible;
        fn bytes(&self, index: usize) -> Result<Vec<u8>, Infallible> {
            self.note(index);
            Ok(Vec::new())
        }
        fn bytes_or_null(&self, index: usize) -> Result<Option<Vec<u8>>, Infallible> {
            self.note(index);
            Ok(None)
        }
        fn text(&self, index: usize) -> Result<String, Infallible> {
            self.note(index);
            Ok(String::new())
        }
        fn text_or_null(&self, index: usize) -> Result<Option<String>, Infallible> {
            self.note(index);
            Ok(None)
        }
        fn int(&self, index: usize) -> Result<i64, Infallible> {
            self.note(index);
            Ok(0)
        }
        fn int_or_null(&self, index: usize) -> Result<Option<i64>, Infallible> {
            self.note(index);
            Ok(None)
        }
        fn flag(&self, index: usize) -> Result<bool, Infallible> {
            self.note(index);
            Ok(false)
        }
    }

    /// The positions a row type reads, in the order it reads them.
    fn positions<T: ReadRow>() -> Vec<usize> {
        let probe = Probe::default();
        let Ok(_) = T::read(&probe);
        probe.0.into_inner()
    }

    /// Every position of a columns list, in order.
    fn every(columns: &str) -> Vec<usize> {
        (0..columns.split(',').count()).collect()
    }

    #[test]
    fn each_row_reads_every_column_of_its_list_once_in_order() {
        assert_eq!(positions::<TaskRow>(), every(crate::TASK_COLUMNS));
        assert_eq!(positions::<ClientRow>(), every(crate::CLIENT_COLUMNS));
        assert_eq!(positions::<ModelRow>(), every(crate::MODEL_COLUMNS));
        assert_eq!(
            positions::<IdempotencyRow>(),
            every(crate::IDEMPOTENCY_COLUMNS)
        );
        assert_eq!(positions::<FileRow>(), every(crate::FILE_COLUMNS));
        assert_eq!(positions::<BatchRow>(), every(crate::BATCH_COLUMNS));
        assert_eq!(positions::<EndpointRow>(), every(crate::ENDPOINT_COLUMNS));
        assert_eq!(positions::<DeliveryRow>(), every(crate::DELIVERY_COLUMNS));
    }
}
