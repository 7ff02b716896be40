//! The offline commands: clients, models and backup, on a data directory whether or not a
//! server runs on it (SQLite lets both write). They never create a database.

use std::sync::Arc;

use anyhow::{bail, Context};

use lmsp_app::{clients_offline, models_offline, AppError, LimitsUpdate};
use lmsp_domain::auth::Scopes;
use lmsp_domain::ports::{ModelFiles, Progress, Store};
use lmsp_domain::{ClientId, ModelId};
use lmsp_models_fs::FsModelFiles;
use lmsp_storage_postgres::{PostgresOptions, PostgresStore};
use lmsp_storage_sqlite::{SqliteOptions, SqliteStore};

use crate::cli::{ClientsCommand, DataDir, ModelsCommand};
use crate::datadir;

async fn open(data: &DataDir) -> anyhow::Result<Arc<dyn Store>> {
    if let Some(url) = &data.database {
        let store = PostgresStore::connect_without_listener(url, PostgresOptions::default())
            .await
            .with_context(|| format!("cannot open the database {}", redacted(url)))?;
        return Ok(Arc::new(store));
    }
    let path = datadir::existing_database(&data.data_dir)?;
    let store = SqliteStore::open_without_listener(&path, SqliteOptions::default())
        .with_context(|| format!("cannot open the database {}", path.display()))?;
    Ok(Arc::new(store))
}

/// A database URL without its password, for messages.
pub fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let credentials = &url[scheme + 3..at];
            let user = credentials.split(':').next().unwrap_or("");
            format!("{}{user}@{}", &url[..scheme + 3], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

/// `lmsp clients …`.
pub async fn clients(command: ClientsCommand) -> anyhow::Result<()> {
    match command {
        ClientsCommand::Add {
            name,
            scopes,
            limits,
            data,
        } => {
            // A refused limit adds no client.
            let update = limits.update();
            update.check()?;
            let store = open(&data).await?;
            let added =
                clients_offline::add_client(store.as_ref(), &name, Scopes::new(scopes)).await?;
            if update != LimitsUpdate::default() {
                clients_offline::update_limits(store.as_ref(), added.client.id, update).await?;
            }
            println!("{}", added.client.id);
            println!("{}", added.token.expose());
        }
        ClientsCommand::Update { id, limits, data } => {
            let client_id = ClientId::parse(&id)
                .map_err(|_| anyhow::anyhow!("`{id}` is not a client id (cli_…)"))?;
            let store = open(&data).await?;
            match clients_offline::update_limits(store.as_ref(), client_id, limits.update()).await {
                Ok((_, limits)) => println!(
                    "{id}\tmax_running {}\tmax_queued {}",
                    limit_text(limits.max_running),
                    limit_text(limits.max_queued)
                ),
                Err(AppError::NotFound) => bail!("no client {id}"),
                Err(error) => return Err(error.into()),
            }
        }
        ClientsCommand::List { data } => {
            let store = open(&data).await?;
            let clients = store.list_clients().await?;
            println!("ID\tNAME\tSCOPES\tSTATE\tCREATED\tMAX_RUNNING\tMAX_QUEUED");
            for client in clients {
                let limits = store.client_limits(client.id).await?;
                let scopes: Vec<_> = client.scopes.iter().map(|s| s.as_str()).collect();
                let state = if client.revoked_at.is_some() {
                    "revoked"
                } else {
                    "active"
                };
                println!(
                    "{}\t{}\t{}\t{}\t{}\t{}\t{}",
                    client.id,
                    client.name,
                    scopes.join(","),
                    state,
                    client.created_at,
                    limit_text(limits.max_running),
                    limit_text(limits.max_queued)
                );
            }
        }
        ClientsCommand::Revoke { id, data } => {
            let client_id = ClientId::parse(&id)
                .map_err(|_| anyhow::anyhow!("`{id}` is not a client id (cli_…)"))?;
            let store = open(&data).await?;
            match clients_offline::revoke_client(store.as_ref(), client_id).await {
                Ok(()) => println!("revoked {id}"),
                Err(AppError::NotFound) => bail!("no active client {id}"),
                Err(error) => return Err(error.into()),
            }
        }
    }
    Ok(())
}

/// A limit as the client commands print it.
fn limit_text(limit: Option<u32>) -> String {
    limit.map_or_else(|| String::from("none"), |n| n.to_string())
}

/// `lmsp models …`.
pub async fn models(command: ModelsCommand) -> anyhow::Result<()> {
    let ModelsCommand::Add {
        id,
        path,
        models_dir,
        data,
    } = command;
    let model_id = ModelId::parse(&id)?;
    let store = open(&data).await?;
    let files = FsModelFiles::new(models_dir.unwrap_or_else(|| data.data_dir.join("models")));
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} ({eta})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message(format!("hashing {id}"));
    let shown = bar.clone();
    let progress: Progress = Box::new(move |done, total| {
        shown.set_length(total);
        shown.set_position(done);
    });
    let registered = models_offline::register_model_file(
        store.as_ref(),
        &files as &dyn ModelFiles,
        model_id,
        &path.to_string_lossy(),
        Some(progress),
    )
    .await;
    bar.finish_and_clear();
    match registered {
        Ok(record) => {
            let file = record
                .file()
                .map(|f| (f.digest.to_string(), f.path.clone()));
            let (digest, path) = file.unwrap_or_default();
            println!("{}\t{}\t{}", record.id, digest, path);
            Ok(())
        }
        Err(AppError::AlreadyExists(_)) => bail!("model `{id}` exists already"),
        Err(error) => Err(error.into()),
    }
}

/// `lmsp backup OUT`.
pub fn backup(out: &std::path::Path, data: &DataDir) -> anyhow::Result<()> {
    if data.database.is_some() {
        bail!(
            "lmsp backup copies the SQLite database of --data-dir; back up PostgreSQL with pg_dump"
        );
    }
    let path = datadir::existing_database(&data.data_dir)?;
    lmsp_storage_sqlite::backup(&path, out)
        .with_context(|| format!("cannot back up {} to {}", path.display(), out.display()))?;
    println!("{}", out.display());
    Ok(())
}
