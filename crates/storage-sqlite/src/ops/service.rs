//! The service's identity and the health probe.

use lmsp_domain::auth::Client;
use lmsp_domain::ports::{Initialized, ServiceIdentity};
use lmsp_domain::time::Timestamp;
use nix::sys::statvfs::statvfs;
use rusqlite::Connection;
use std::path::Path;

use crate::codec;
use crate::error::DbError;
use crate::ops::clients::insert_client;
use crate::ops::{config_value, set_config_value, Res};

/// On an empty store, stores the identity and the admin client together.
pub fn initialize(
    conn: &Connection,
    candidate: &ServiceIdentity,
    admin: &Client,
) -> Res<Initialized> {
    let stored = config_value(conn, codec::IDENTITY_KEY)?;
    if stored.is_none() {
        let doc = codec::identity_to_text(candidate)?;
        set_config_value(conn, codec::IDENTITY_KEY, &doc)?;
        insert_client(conn, admin)?;
    }
    Ok(codec::initialized(stored.as_deref(), candidate)?)
}

/// The pages a probe wants left below the database's size cap: room for a few submits.
const PROBE_ROOM_PAGES: i64 = 4;

/// The bytes a probe wants free on the data directory's file system: room for the WAL to grow
/// and a checkpoint to extend the database file.
const PROBE_ROOM_BYTES: u64 = 1 << 20;

/// Proves the store can take new work: there is room for it, and a tiny write commits.
///
/// The room is checked, not only the commit: the probe's write rewrites one existing row, which
/// SQLite can place in pages it already has (the WAL's, a freed page) while a submit needs new
/// ones, so on a full disk the commit alone would turn health back to ok between two failing
/// submits.
pub fn probe(conn: &Connection, at: Timestamp) -> Res<()> {
    check_room(conn)?;
    set_config_value(conn, "health_probe", &at.as_millis().to_string())
}

/// Fails with [`DbError::NoRoom`] when the database is within [`PROBE_ROOM_PAGES`] of its size
/// cap (`max_page_count`, counting freed pages as room) or its file system has less than
/// [`PROBE_ROOM_BYTES`] available.
fn check_room(conn: &Connection) -> Res<()> {
    let pragma = |name: &str| conn.query_row(&format!("PRAGMA {name}"), [], |row| row.get(0));
    let (pages, freed, cap): (i64, i64, i64) = (
        pragma("page_count")?,
        pragma("freelist_count")?,
        pragma("max_page_count")?,
    );
    if cap.saturating_sub(pages).saturating_add(freed) < PROBE_ROOM_PAGES {
        return Err(DbError::NoRoom(format!(
            "the database uses {pages} of its at most {cap} pages ({freed} free)"
        )));
    }
    let Some(path) = conn.path().filter(|path| !path.is_empty()) else {
        return Ok(());
    };
    let stat = statvfs(Path::new(path)).map_err(|error| {
        DbError::NoRoom(format!("cannot read the free space of {path}: {error}"))
    })?;
    let available = stat.blocks_available().saturating_mul(stat.fragment_size());
    if available < PROBE_ROOM_BYTES {
        return Err(DbError::NoRoom(format!(
            "{available} bytes available on the file system of {path}"
        )));
    }
    Ok(())
}
