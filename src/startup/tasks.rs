//! What a node runs beside its server: the registry heartbeat, the certificate's reload on
//! SIGHUP, and the signals that stop it.

use std::sync::Arc;

use crate::store::Store;
use crate::tls::Certificates;

/// A serving node as the registry knows it (see `store::registry`).
#[derive(Debug, Clone)]
pub(super) struct Node {
    pub(super) name: String,
    /// The subscriptions its config names.
    pub(super) subscriptions: Vec<String>,
    /// A `listen` session not seen for this long is removed (`session_idle_seconds`).
    pub(super) session_idle_ms: i64,
}

/// Say every `registry::HEARTBEAT` that this node is alive, until stopped. A missed beat (the
/// store unavailable) is logged; the node's config then stops holding its subscriptions only
/// once the record is `registry::NODE_TTL_MS` old.
pub(super) async fn heartbeat(
    store: Arc<dyn Store>,
    node: Node,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(crate::store::registry::HEARTBEAT) => {}
            _ = stopped.changed() => return,
        }
        let (store, node) = (Arc::clone(&store), node.clone());
        let beat = tokio::task::spawn_blocking(move || {
            let now = crate::domain::time::now_ms();
            store.node_seen(&node.name, &node.subscriptions, now)?;
            store.prune_subscriptions(now, now.saturating_sub(node.session_idle_ms))
        })
        .await;
        match beat {
            Ok(Ok(0)) => {}
            Ok(Ok(removed)) => tracing::info!(
                removed,
                "subscriptions no live node's config names any more, or idle sessions: removed"
            ),
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot record this node's heartbeat"),
            Err(e) => tracing::warn!(error = %e, "the heartbeat task failed"),
        }
    }
}

/// Read the certificate files again at each SIGHUP (a renewed certificate), for as long as the
/// server runs. Connections already open are not touched.
pub(super) async fn reload_on_hangup(certificates: Arc<Certificates>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangups = match signal(SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot watch SIGHUP: the certificate will not reload");
                return;
            }
        };
        while hangups.recv().await.is_some() {
            match certificates.reload() {
                Ok(()) => tracing::info!("SIGHUP: TLS certificate reloaded"),
                Err(e) => tracing::error!(
                    error = format!("{e:#}"),
                    "SIGHUP: the TLS certificate did not reload; the one in use stays"
                ),
            }
        }
    }
    #[cfg(not(unix))]
    let _ = certificates;
}

/// SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => tracing::info!("SIGINT received"),
        _ = term => tracing::info!("SIGTERM received"),
    }
}
