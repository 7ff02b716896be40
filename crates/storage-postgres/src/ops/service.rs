//! The service's identity and the health probe.

use lmsp_domain::auth::Client;
use lmsp_domain::ports::{Initialized, ServiceIdentity};
use lmsp_domain::time::Timestamp;

use crate::codec;
use crate::ops::clients::insert_client;
use crate::ops::{config_value, set_config_value, Db, Res};

/// On an empty store, stores the identity and the admin client together; of two processes
/// initializing at once, one stores its candidate and the other finds it.
pub async fn initialize<C: Db>(
    db: &C,
    candidate: &ServiceIdentity,
    admin: &Client,
) -> Res<Initialized> {
    let inserted = db
        .execute(
            "INSERT INTO service_config (key, value) VALUES ('identity', $1) \
             ON CONFLICT (key) DO NOTHING",
            &[&codec::identity_to_text(candidate)?],
        )
        .await?;
    let stored = if inserted == 0 {
        let doc = config_value(db, codec::IDENTITY_KEY, false).await?;
        Some(doc.ok_or_else(|| crate::ops::corrupt("the identity vanished"))?)
    } else {
        insert_client(db, admin).await?;
        None
    };
    Ok(codec::initialized(stored.as_deref(), candidate)?)
}

/// A tiny write whose commit proves the store accepts commits.
pub async fn probe<C: Db>(db: &C, at: Timestamp) -> Res<()> {
    set_config_value(db, "health_probe", &at.as_millis().to_string()).await
}
