//! The end of `inferno serve`: the first SIGTERM or SIGINT drains in-flight requests within the
//! grace period; a second one stops at once, once the audit log's final checkpoint is signed.

use std::future::Future;

use crate::server::Server;

/// Shuts `server` down, draining in-flight requests, unless `second_signal` resolves first: then
/// stops the engine, signs the audit log's final checkpoint (its `server stopped` record says
/// the stop was forced) and exits the process with status 1.
pub(super) async fn drain_or_force(server: Server, second_signal: impl Future<Output = ()>) {
    let app = std::sync::Arc::clone(server.app());
    tokio::select! {
        () = server.shutdown() => {}
        () = second_signal => {
            tracing::warn!(
                "second shutdown signal: stopping now, without waiting for in-flight requests"
            );
            if let Some(service) = app.service() {
                service.engine().shutdown();
            }
            if let Some(audit) = app.audit()
                && let Err(err) = audit.shutdown("server stopped by a second signal").await
            {
                tracing::error!(error = %err, "audit: final checkpoint failed");
            }
            tracing::warn!("stopped (forced by a second signal)");
            std::process::exit(1);
        }
    }
}
