//! The secrets a forwarder signs with and a pull route checks tokens against, read from the
//! store and kept for a moment: read again when the store's view of the registry moved (a
//! rotation moves it) or after [`TTL`], so that every node signs with a rotated secret, and
//! stops accepting an old one, within about a second, without a restart. Expiry is checked at
//! each use, so a grace ends on time whatever the cache holds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use subtle::ConstantTimeEq;

use super::Vault;
use crate::domain::time::now_ms;
use crate::signature::Secret;
use crate::store::secrets::Purpose;

/// How long a read of the secrets serves at most.
pub const TTL: Duration = Duration::from_secs(1);

/// One subscription's secrets, as the store held them at a moment.
#[derive(Default)]
struct Held {
    /// Signing secrets, current first, each with the end of its grace.
    signing: Vec<(Secret, Option<i64>)>,
    /// Pull tokens' digests (`sha256:<hex>`), each with the end of its grace.
    tokens: Vec<(String, Option<i64>)>,
}

struct Read {
    at: Instant,
    version: Option<i64>,
    held: Arc<Held>,
}

/// The live secrets of one subscription on this node.
pub struct Live {
    vault: Arc<Vault>,
    name: String,
    read: parking_lot::Mutex<Option<Read>>,
}

fn valid(expires_at: Option<i64>, now: i64) -> bool {
    expires_at.is_none_or(|at| at > now)
}

impl Live {
    pub fn new(vault: Arc<Vault>, name: &str) -> Live {
        Live {
            vault,
            name: name.to_string(),
            read: parking_lot::Mutex::new(None),
        }
    }

    /// What the store holds now, or the last read while it cannot answer (a node keeps
    /// signing through a database blip); an error only when there is no read at all.
    async fn held(&self) -> anyhow::Result<Arc<Held>> {
        let version = self.vault.store().registry_version_seen();
        if let Some(read) = &*self.read.lock()
            && read.at.elapsed() < TTL
            && read.version == version
        {
            return Ok(Arc::clone(&read.held));
        }
        let vault = Arc::clone(&self.vault);
        let name = self.name.clone();
        let fresh = tokio::task::spawn_blocking(move || vault.secrets(&name, now_ms())).await;
        let fresh = match fresh {
            Ok(Ok(secrets)) => secrets,
            failed => {
                let error = match failed {
                    Ok(Err(e)) => anyhow::Error::new(e),
                    Err(e) => anyhow::Error::new(e),
                    Ok(Ok(_)) => unreachable!(),
                };
                if let Some(read) = &*self.read.lock() {
                    tracing::warn!(subscription = %self.name, error = %error,
                        "cannot read the subscription's secrets again: using the last read");
                    return Ok(Arc::clone(&read.held));
                }
                return Err(error.context(format!("reading the secrets of `{}`", self.name)));
            }
        };
        let mut held = Held::default();
        for (kept, open) in fresh {
            match kept.purpose {
                Purpose::Signing => held.signing.push((Secret::new(open), kept.expires_at)),
                Purpose::Token => held.tokens.push((open, kept.expires_at)),
                Purpose::Claims => {}
            }
        }
        let held = Arc::new(held);
        *self.read.lock() = Some(Read {
            at: Instant::now(),
            version,
            held: Arc::clone(&held),
        });
        Ok(held)
    }

    /// The secrets to sign with now: the current one and those in a rotation's grace.
    pub async fn signing(&self) -> anyhow::Result<Vec<Secret>> {
        let held = self.held().await?;
        let now = now_ms();
        Ok(held
            .signing
            .iter()
            .filter(|(_, until)| valid(*until, now))
            .map(|(s, _)| s.clone())
            .collect())
    }

    /// Whether `given` is a token of this subscription now (its digest compared in constant
    /// time with each kept one). A store that cannot answer, with nothing read before, lets
    /// nobody in.
    pub async fn authorizes(&self, given: &str) -> bool {
        let held = match self.held().await {
            Ok(held) => held,
            Err(e) => {
                tracing::warn!(subscription = %self.name, error = %e, "cannot check a pull token");
                return false;
            }
        };
        let now = now_ms();
        let digest = crate::store::secrets::token_digest(given);
        let mut found = subtle::Choice::from(0);
        for (kept, until) in &held.tokens {
            if valid(*until, now) {
                found |= kept.as_bytes().ct_eq(digest.as_bytes());
            }
        }
        found.into()
    }
}
