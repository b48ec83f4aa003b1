//! Every controller of the operator in one process, sharing the client, the metrics and the
//! shutdown: EtcdCluster ([`crate::reconcile`]), EtcdBackup and EtcdRestore ([`crate::backup`]). One
//! Deployment serves all the kinds (CoreOS needed three).

use std::future::Future;
use std::sync::Arc;

use futures::FutureExt as _;

use crate::admin::Readiness;
use crate::backup::config::BackupConfig;
use crate::backup::reconciler::BackupReconciler;
use crate::backup::restore::RestoreReconciler;
use crate::context::Context;
use crate::controller_loop::run_kind;
use crate::reconcile::run_controller;

/// Runs every controller until `shutdown` resolves. `ready` follows the EtcdCluster
/// controller's watches (see [`run_controller`]).
pub async fn run_all(
    ctx: Arc<Context>,
    namespace: Option<String>,
    concurrency: u16,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
    ready: Readiness,
) {
    let shutdown = shutdown.shared();
    let backups = Arc::new(BackupReconciler::new(
        ctx.client.clone(),
        ctx.metrics.backups.clone(),
        ctx.reporter.clone(),
        BackupConfig {
            etcd_timeout: ctx.config.etcd_timeout,
            policy: ctx.config.policy(),
            image: ctx.config.restore_image.clone(),
            ..BackupConfig::default()
        },
    ));
    let restores = Arc::new(RestoreReconciler::new(
        ctx.client.clone(),
        ctx.metrics.backups.clone(),
        ctx.reporter.clone(),
        ctx.config.policy(),
        ctx.config.restore_image.clone(),
    ));
    futures::join!(
        run_controller(
            ctx.clone(),
            namespace.clone(),
            concurrency,
            shutdown.clone(),
            ready
        ),
        run_kind(
            backups,
            &ctx.client,
            namespace.as_deref(),
            concurrency.clamp(1, 4),
            shutdown.clone()
        ),
        run_kind(restores, &ctx.client, namespace.as_deref(), 2, shutdown),
    );
}
