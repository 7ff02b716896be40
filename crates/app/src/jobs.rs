//! The background jobs besides the workers and the purge: the instance's lease, the rescuer of
//! stopped instances, the store's health probe, and (for a shared store) the poll for cancels a
//! lost notification would otherwise leave unheard.

use std::time::Duration;

use crate::service::Service;

/// Renews this instance's lease three times per lease. A lost lease (another instance declared
/// this one stopped and recovered its tasks) is fatal: the process must start afresh.
pub(crate) async fn run_lease(service: Service) {
    let inner = &service.inner;
    let every = inner.settings.lease / 3;
    loop {
        tokio::select! {
            () = inner.stop_now.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        let until = service.after(inner.settings.lease);
        match inner
            .store
            .renew_lease(inner.instance, until, service.now())
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                tracing::error!(
                    instance = %inner.instance,
                    "this instance's lease was lost: another instance recovered its tasks"
                );
                inner.fatal.cancel();
                return;
            }
            Err(error) => tracing::warn!(%error, "could not renew this instance's lease"),
        }
    }
}

/// Looks for stopped instances twice per lease and recovers their tasks (P-7…P-11).
pub(crate) async fn run_rescuer(service: Service) {
    let inner = &service.inner;
    let every = (inner.settings.lease / 2).max(Duration::from_millis(100));
    loop {
        tokio::select! {
            () = inner.stop_taking_work.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        match service.recover_stopped_instances().await {
            Ok(report) if report.moved > 0 || report.untouched > 0 => {
                inner.listener.metrics.record_recovery(&report);
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

/// While the store is unhealthy, tries a tiny commit every second, so health turns back to ok as
/// soon as the store can commit again, whether or not anything else writes.
pub(crate) async fn run_health_probe(service: Service) {
    let inner = &service.inner;
    loop {
        tokio::select! {
            () = inner.stop_now.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        if !inner.listener.health.is_healthy() {
            let probed = inner.store.check_writable(service.now()).await;
            inner.listener.health.record(probed.is_ok());
        }
    }
}

/// For a shared store: every `every`, raises the cancel of each `cancelling` task this instance
/// runs, in case the notice of the cancel was lost.
pub(crate) async fn run_cancel_poll(service: Service, every: Duration) {
    let inner = &service.inner;
    loop {
        tokio::select! {
            () = inner.stop_now.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        match inner.store.cancelling_tasks(inner.instance).await {
            Ok(tasks) => {
                for task in tasks {
                    inner.listener.running.cancel(task);
                }
            }
            Err(error) => tracing::debug!(%error, "could not poll for cancels"),
        }
    }
}
