//! The background jobs besides the workers and the purge: the instance's lease, the rescuer of
//! stopped instances, the store's health probe, and (for a shared store) the poll for cancels a
//! lost notification would otherwise leave unheard.

use std::sync::Arc;
use std::time::Duration;

use lmsp_domain::ports::RecoveryReport;
use lmsp_domain::InstanceId;

use crate::error::AppError;
use crate::lifecycle::Lifecycle;
use crate::shared::Core;
use crate::worker::Workers;

/// Recovers one stopped instance's leftover tasks (P-7…P-11); its resumed tasks go to this
/// instance's workers first.
pub(crate) async fn recover(
    core: &Core,
    workers: &Workers,
    stopped: InstanceId,
) -> Result<RecoveryReport, AppError> {
    let report = core
        .store
        .recover_instance(stopped, core.instance, core.now())
        .await?;
    workers.resume(&report.resumed);
    Ok(report)
}

/// Recovers every instance the store knows to have stopped.
pub(crate) async fn recover_stopped_instances(
    core: &Core,
    workers: &Workers,
) -> Result<RecoveryReport, AppError> {
    let stopped = core
        .store
        .stopped_instances(core.instance, core.now())
        .await?;
    let mut report = RecoveryReport::default();
    for instance in stopped {
        report.absorb(recover(core, workers, instance).await?);
    }
    Ok(report)
}

/// Renews this instance's lease three times per lease. A lost lease (another instance declared
/// this one stopped and recovered its tasks) is fatal: the process must start afresh.
pub(crate) async fn run_lease(core: Arc<Core>, life: Arc<Lifecycle>) {
    let every = core.settings.lease / 3;
    loop {
        tokio::select! {
            () = life.stop_now.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        let until = core.after(core.settings.lease);
        match core
            .store
            .renew_lease(core.instance, until, core.now())
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                tracing::error!(
                    instance = %core.instance,
                    "this instance's lease was lost: another instance recovered its tasks"
                );
                life.fatal.cancel();
                return;
            }
            Err(error) => tracing::warn!(%error, "could not renew this instance's lease"),
        }
    }
}

/// Looks for stopped instances twice per lease and recovers their tasks (P-7…P-11).
pub(crate) async fn run_rescuer(core: Arc<Core>, life: Arc<Lifecycle>, workers: Workers) {
    let every = (core.settings.lease / 2).max(Duration::from_millis(100));
    loop {
        tokio::select! {
            () = life.stop_taking_work.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        match recover_stopped_instances(&core, &workers).await {
            Ok(report) if report.moved > 0 || report.untouched > 0 => {
                core.listener.metrics.record_recovery(&report);
                tracing::info!(
                    moved = report.moved - report.resumed.len() as u64,
                    resumed = report.resumed.len(),
                    untouched = report.untouched,
                    "recovered the tasks of a stopped instance"
                );
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "could not recover stopped instances"),
        }
    }
}

/// How often the health probe commits while the store is healthy: a tiny write, cheap at this
/// pace, that finds a store whose failure no other write has met yet (an idle service, a writer
/// that stopped between two writes).
pub(crate) const PROBE_WHILE_HEALTHY: Duration = Duration::from_secs(5);

/// How often the health probe commits while the store is unhealthy, so health turns back to ok
/// as soon as the store can commit again, whether or not anything else writes.
pub(crate) const PROBE_WHILE_UNHEALTHY: Duration = Duration::from_secs(1);

/// Tries a tiny commit now and then — every [`PROBE_WHILE_HEALTHY`] while the store is healthy,
/// every [`PROBE_WHILE_UNHEALTHY`] while it is not — and records the outcome as the store's
/// health.
pub(crate) async fn run_health_probe(core: Arc<Core>, life: Arc<Lifecycle>) {
    let health = &core.listener.health;
    loop {
        let every = if health.is_healthy() {
            PROBE_WHILE_HEALTHY
        } else {
            PROBE_WHILE_UNHEALTHY
        };
        tokio::select! {
            () = life.stop_now.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        let was_healthy = health.is_healthy();
        let probed = core.store.check_writable(core.now()).await;
        match &probed {
            Err(error) if was_healthy => {
                tracing::warn!(%error, "the store cannot commit: health answers 503");
            }
            Ok(()) if !was_healthy => tracing::info!("the store commits again: health answers 200"),
            _ => {}
        }
        health.record_probe(probed.is_ok());
    }
}

/// For a shared store: every `every`, raises the cancel of each `cancelling` task this instance
/// runs, in case the notice of the cancel was lost.
pub(crate) async fn run_cancel_poll(core: Arc<Core>, life: Arc<Lifecycle>, every: Duration) {
    loop {
        tokio::select! {
            () = life.stop_now.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        match core.store.cancelling_tasks(core.instance).await {
            Ok(tasks) => {
                for task in tasks {
                    core.listener.running.cancel(task);
                }
            }
            Err(error) => tracing::debug!(%error, "could not poll for cancels"),
        }
    }
}
