//! The service's identity and the health probe.

use lmsp_domain::auth::Client;
use lmsp_domain::ports::{Initialized, ServiceIdentity};
use lmsp_domain::time::Timestamp;
use rusqlite::Connection;

use crate::codec;
use crate::ops::clients::insert_client;
use crate::ops::{config_value, set_config_value, Res};

/// On an empty store, stores the identity and the admin client together.
pub fn initialize(
    conn: &Connection,
    candidate: &ServiceIdentity,
    admin: &Client,
) -> Res<Initialized> {
    if let Some(doc) = config_value(conn, "identity")? {
        return Ok(Initialized {
            identity: codec::identity_from_text(&doc)?,
            first_start: false,
        });
    }
    set_config_value(conn, "identity", &codec::identity_to_text(candidate)?)?;
    insert_client(conn, admin)?;
    Ok(Initialized {
        identity: candidate.clone(),
        first_start: true,
    })
}

/// A tiny write whose commit proves the store accepts commits.
pub fn probe(conn: &Connection, at: Timestamp) -> Res<()> {
    set_config_value(conn, "health_probe", &at.as_millis().to_string())
}
