//! What a node serves of the registry (SPEC section 13, "One registry"): a forwarder for every
//! live `http` subscription and the routes of every live `pull` subscription, whatever this
//! node's config names, each with the settings, rules and secrets the registry holds.
//!
//! The registry is read again whenever its version moves (a point read every [`CHECK`], so
//! that a change made through any node is served within a second): a forwarder whose
//! subscription changed is stopped and started again with the new settings, one whose
//! subscription is gone is stopped (each lets its calls in flight finish and commits their
//! answers, fenced by their claims as always), and the pull routes are rebuilt.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::forward::{ForwardOptions, Forwarder};
use crate::metrics::Metrics;
use crate::pull::Puller;
use crate::secrets::{Live, Vault};
use crate::store::{Store, StoreResult};
use crate::subscriptions::{Kind, Subscription};

/// How often the registry's version is looked at.
pub const CHECK: Duration = Duration::from_millis(250);

/// The registry at one version: its live subscriptions with their ids.
pub type Snapshot = (i64, Vec<(i64, Subscription)>);

/// The `http` and `pull` subscriptions this node serves, from the registry.
pub struct Served {
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    /// The subscriptions' secrets: each forwarder signs, and each pull route checks tokens,
    /// with what the store holds now (`secrets::Live`).
    vault: Arc<Vault>,
    options: ForwardOptions,
    /// Whether this node forwards (a node with no workers claims nothing).
    forwarding: bool,
    pullers: parking_lot::RwLock<Vec<Arc<Puller>>>,
    /// The registry's version of the last read, and what it served.
    seen: parking_lot::Mutex<Option<Snapshot>>,
    /// The registry's version the running forwarders were made (or kept) for: a forwarder
    /// whose claim saw a later one gives its claims back until this catches up (see
    /// `Forwarder::fenced_by`), so that no call goes out with settings changed meanwhile.
    applied: watch::Sender<i64>,
    /// A forwarder whose claim saw a later version asks for a read now.
    read_now: Arc<Notify>,
}

/// A running forwarder.
struct Running {
    id: i64,
    sub: Subscription,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Served {
    pub fn new(
        store: Arc<dyn Store>,
        metrics: Arc<Metrics>,
        vault: Arc<Vault>,
        options: ForwardOptions,
        forwarding: bool,
    ) -> Served {
        Served {
            store,
            metrics,
            vault,
            options,
            forwarding,
            pullers: parking_lot::RwLock::new(Vec::new()),
            seen: parking_lot::Mutex::new(None),
            applied: watch::channel(0).0,
            read_now: Arc::new(Notify::new()),
        }
    }

    /// The pull routes of `name`, if the registry has a live `pull` subscription by that name.
    pub fn puller(&self, name: &str) -> Option<Arc<Puller>> {
        self.pullers
            .read()
            .iter()
            .find(|p| p.sub.name == name)
            .cloned()
    }

    /// Read the registry (blocking) and serve its pull subscriptions: `Some` with what it
    /// holds when its version moved since the last read.
    pub fn refresh(&self) -> StoreResult<Option<Snapshot>> {
        let (version, live) = self.store.registry_at()?;
        if matches!(&*self.seen.lock(), Some((v, _)) if *v == version) {
            return Ok(None);
        }
        let subs = crate::store::registry::served(&live);
        let mut pullers = Vec::new();
        let mut complete = true;
        for (id, sub) in subs.iter().filter(|(_, sub)| sub.kind == Kind::Pull) {
            match self.vault.claims_key(&sub.name, None) {
                Ok(key) => {
                    let tokens = Live::new(Arc::clone(&self.vault), &sub.name);
                    if let Some(puller) = Puller::new(*id, sub.clone(), &self.metrics, key, tokens)
                        .map(|p| p.shaped_by(Arc::clone(&self.options.transforms)))
                    {
                        let session = live.iter().any(|l| l.id == *id && l.is_session());
                        pullers.push(Arc::new(if session { puller.as_session() } else { puller }));
                    }
                }
                Err(e) => {
                    // Its routes stay as they were, and the next check reads the registry
                    // again (this version is not marked seen).
                    tracing::warn!(subscription = %sub.name, error = format!("{e:#}"),
                        "cannot read the claims key of a pull subscription: read again shortly");
                    complete = false;
                    if let Some(kept) = self.puller(&sub.name) {
                        pullers.push(kept);
                    }
                }
            }
        }
        *self.pullers.write() = pullers;
        if complete {
            *self.seen.lock() = Some((version, subs.clone()));
        }
        Ok(Some((version, subs)))
    }

    /// Serve until `stopped`: forwarders started, rebuilt and stopped as the registry moves.
    /// At the end every forwarder is stopped and waited for.
    pub async fn run(self: Arc<Self>, queued: Arc<Notify>, mut stopped: watch::Receiver<bool>) {
        let mut running: HashMap<String, Running> = HashMap::new();
        // Forwarders stopped by a change, finishing their calls in flight: waited for at the
        // end, so that no call is cut off by the runtime's stop after it may have arrived.
        let mut stopping: Vec<Running> = Vec::new();
        let mut first = self.seen.lock().clone();
        loop {
            let read = match first.take() {
                Some(subs) => Some(subs),
                None => {
                    let me = Arc::clone(&self);
                    match tokio::task::spawn_blocking(move || me.refresh()).await {
                        Ok(Ok(read)) => read,
                        Ok(Err(e)) => {
                            tracing::warn!(error = %e, "cannot read the registry of subscriptions");
                            None
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "reading the registry panicked");
                            None
                        }
                    }
                }
            };
            stopping.retain(|r| !r.task.is_finished());
            if let Some((version, subs)) = read {
                self.forward(&subs, &mut running, &mut stopping, &queued);
                self.applied.send_replace(version);
            }
            tokio::select! {
                _ = stopped.changed() => break,
                _ = tokio::time::sleep(CHECK) => {}
                _ = self.read_now.notified() => {}
            }
        }
        stopping.extend(running.into_values());
        for r in &stopping {
            let _ = r.stop.send(true);
        }
        for r in stopping {
            if let Err(e) = r.task.await {
                tracing::error!(error = %e, subscription = %r.sub.name, "forwarder ended abnormally");
            }
        }
    }

    /// Make the running forwarders the registry's `http` subscriptions.
    fn forward(
        &self,
        subs: &[(i64, Subscription)],
        running: &mut HashMap<String, Running>,
        stopping: &mut Vec<Running>,
        queued: &Arc<Notify>,
    ) {
        let wanted: HashMap<&str, (i64, &Subscription)> = subs
            .iter()
            .filter(|(_, sub)| self.forwarding && sub.kind.is_call_out())
            .map(|(id, sub)| (sub.name.as_str(), (*id, sub)))
            .collect();
        let changed: Vec<String> = running
            .iter()
            .filter(|(name, r)| {
                !wanted
                    .get(name.as_str())
                    .is_some_and(|(id, sub)| *id == r.id && **sub == r.sub)
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in changed {
            if let Some(r) = running.remove(&name) {
                // Its calls in flight finish and commit by themselves (not awaited here: a slow
                // endpoint must not hold the others' changes up; `run` waits at the end).
                let _ = r.stop.send(true);
                tracing::info!(subscription = %name, "forwarder stopped: the registry changed");
                stopping.push(r);
            }
        }
        for (name, (id, sub)) in wanted {
            if running.contains_key(name) {
                continue;
            }
            let forwarder = match Forwarder::new(
                Arc::clone(&self.store),
                Arc::clone(&self.metrics),
                id,
                sub.clone(),
                Live::new(Arc::clone(&self.vault), &sub.name),
                self.options.clone(),
            ) {
                Ok(f) => {
                    Arc::new(f.fenced_by(self.applied.subscribe(), Arc::clone(&self.read_now)))
                }
                Err(e) => {
                    // Read again only when the registry moves: one line per change.
                    tracing::warn!(subscription = %name, error = format!("{e:#}"), "this node cannot forward this subscription");
                    continue;
                }
            };
            let (stop, stopped) = watch::channel(false);
            let task = match forwarder.start(Arc::clone(queued), stopped) {
                Ok(task) => task,
                Err(e) => {
                    tracing::error!(subscription = %name, error = format!("{e:#}"), "cannot start a thread for this subscription's forwarder");
                    continue;
                }
            };
            tracing::info!(subscription = %name, "forwarder started");
            running.insert(
                name.to_string(),
                Running {
                    id,
                    sub: sub.clone(),
                    stop,
                    task,
                },
            );
        }
    }
}
