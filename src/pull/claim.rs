//! One claim of a pull subscription: the store's claim on the blocking pool, given back when
//! its client is gone, then shaped by the subscription's transform.

use std::sync::Arc;

use tokio::sync::oneshot;

use super::Puller;
use crate::domain::time::now_ms;
use crate::store::{ClaimRef, Claimed, Store, StoreError, StoreResult};

/// One claim on the blocking pool. If the caller is gone by the time it commits (the client
/// disconnected and its request was dropped), its claims go back at once rather than waiting
/// out their leases. With a `transform`, each claim's body is its output, and a claim it gave
/// no output for or failed on is finished here, never handed out.
pub async fn claim_once(
    store: &Arc<dyn Store>,
    puller: &Puller,
    worker: &str,
    max: usize,
    lease_ms: i64,
) -> StoreResult<Vec<Claimed>> {
    let claims = claim_stored(store, puller.id, worker, max, lease_ms).await?;
    match (&puller.transforms, &puller.sub.transform) {
        (Some(pool), Some(transform)) => {
            let counters = &puller.transform_counters;
            crate::forward::shape::shape_claims(pool, store, Some(transform), counters, claims)
                .await
        }
        (None, Some(_)) if !claims.is_empty() => {
            // A puller made without workers (not by `Served`) must not hand out untransformed
            // bodies: the claims go back.
            let refs: Vec<ClaimRef> = claims.iter().map(|c| c.claim.clone()).collect();
            let store = Arc::clone(store);
            let _ = tokio::task::spawn_blocking(move || store.release(&refs, now_ms())).await;
            Ok(Vec::new())
        }
        _ => Ok(claims),
    }
}

async fn claim_stored(
    store: &Arc<dyn Store>,
    sub: i64,
    worker: &str,
    max: usize,
    lease_ms: i64,
) -> StoreResult<Vec<Claimed>> {
    let (sent, received) = oneshot::channel();
    let store = Arc::clone(store);
    let worker = worker.to_string();
    tokio::task::spawn_blocking(move || {
        let claimed = store
            .claim_subscription(&worker, sub, max, lease_ms, now_ms())
            .map(|c| c.claims);
        if let Err(Ok(claims)) = sent.send(claimed) {
            let refs: Vec<ClaimRef> = claims.iter().map(|c| c.claim.clone()).collect();
            if let Err(e) = store.release(&refs, now_ms()) {
                tracing::warn!(error = %e, "cannot give back a gone client's claims");
            }
        }
    });
    received
        .await
        .map_err(|_| StoreError::Internal(anyhow::anyhow!("the claim's task ended abnormally")))?
}
