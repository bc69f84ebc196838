//! Subscriptions' secrets above the store (SPEC section 13): made once and shared by every
//! node through the store (`store::secrets`), sealed at rest when the nodes have a key
//! ([`seal`]), read by the forwarders and pull routes through a short-lived cache ([`live`]),
//! shown to an admin (`GET /subscriptions/{name}/secret`), and rotated with a grace
//! (`POST /subscriptions/{name}/rotate-secret`).
//!
//! A pull subscription's token is kept only as a digest: shown once, when made (its file in
//! the data folder, as before) or rotated; it cannot be shown again. A secret a node's config
//! gives is the secret: the store follows the config at each start of a node that gives one,
//! and the API does not rotate it (409: change the config, listing the new secret beside the
//! old while receivers move).

pub mod live;
pub mod seal;
mod start;

use std::sync::Arc;

use crate::store::secrets::{Purpose, Rotation, StoredSecret, token_digest};
use crate::store::{Store, StoreError};
use crate::subscriptions::Kind;

pub use live::Live;
pub use seal::{SealError, Sealer};
pub use start::prepare;

/// The store and the nodes' sealing key: where every secret is read and written.
pub struct Vault {
    store: Arc<dyn Store>,
    sealer: Sealer,
}

#[derive(Debug, thiserror::Error)]
pub enum VaultError {
    #[error("no subscription `{0}`")]
    NotFound(String),
    /// The subscription's kind has nothing to show or rotate, or its secret cannot be shown.
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Sealed(#[from] SealError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A rotation's outcome, the new secret shown once.
pub struct Rotated {
    /// `signing` or `token`.
    pub purpose: Purpose,
    pub secret: String,
    pub previous_until: i64,
}

impl std::fmt::Debug for Rotated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rotated")
            .field("purpose", &self.purpose)
            .field("previous_until", &self.previous_until)
            .finish_non_exhaustive()
    }
}

pub use crate::config::{new_pull_token as new_token, new_signing_secret};

impl Vault {
    pub fn new(store: Arc<dyn Store>, sealer: Sealer) -> Vault {
        Vault { store, sealer }
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The value kept for `plain` (sealed where that applies, a digest for a token).
    fn kept_form(&self, name: &str, purpose: Purpose, plain: &str) -> String {
        match purpose {
            Purpose::Token => token_digest(plain),
            _ => self.sealer.seal(name, purpose.as_str(), plain),
        }
    }

    /// A kept value as given (a token's digest stays a digest).
    fn open(&self, name: &str, kept: &StoredSecret) -> Result<String, SealError> {
        match kept.purpose {
            Purpose::Token => Ok(kept.value.clone()),
            p => self.sealer.open(name, p.as_str(), &kept.value),
        }
    }

    /// The key that MACs the claim tokens of pull subscription `name`, shared by every node:
    /// the kept one, or, when none is kept yet, `derived` (the key earlier versions derived
    /// from a token, so that their claims still ack) or a new one, kept now.
    /// A read first (a node serving the registry asks at each change of it), a write only when
    /// none is kept.
    pub fn claims_key(&self, name: &str, derived: Option<[u8; 32]>) -> anyhow::Result<[u8; 32]> {
        let now = crate::domain::time::now_ms();
        let current = self
            .secrets(name, now)?
            .into_iter()
            .find(|(k, _)| k.purpose == Purpose::Claims && k.expires_at.is_none())
            .map(|(_, open)| open);
        let open = match current {
            Some(open) => open,
            None => {
                let key = derived.unwrap_or_else(crate::config::new_secret_bytes::<32>);
                let offered = self.kept_form(name, Purpose::Claims, &hex::encode(key));
                let kept = self
                    .store
                    .keep_secret(name, Purpose::Claims, &offered, now)?;
                self.open(name, &kept)?
            }
        };
        hex::decode(open)
            .ok()
            .and_then(|k| k.try_into().ok())
            .ok_or_else(|| anyhow::anyhow!("the claims key of `{name}` is not 32 bytes"))
    }

    /// The secrets a new subscription of `kind` starts with, made through the API: the one its
    /// body gives or a new one (shown once: the second value), and a pull subscription's claims
    /// key; each in the form the store keeps (sealed, or a token's digest), for
    /// `Store::create_subscription` to write with the subscription, in its transaction.
    pub fn first_secrets(
        &self,
        name: &str,
        kind: Kind,
        given: Option<&str>,
    ) -> (Vec<(Purpose, String)>, Option<String>) {
        let (purpose, made) = match kind {
            Kind::Http => (Purpose::Signing, new_signing_secret as fn() -> String),
            Kind::Pull => (Purpose::Token, new_token as fn() -> String),
            _ => return (Vec::new(), None),
        };
        let plain = given.map_or_else(made, str::to_string);
        let mut kept = vec![(purpose, self.kept_form(name, purpose, &plain))];
        if kind == Kind::Pull {
            let key = hex::encode(crate::config::new_secret_bytes::<32>());
            kept.push((Purpose::Claims, self.kept_form(name, Purpose::Claims, &key)));
        }
        (kept, given.is_none().then_some(plain))
    }

    /// Every secret of `name` valid at `now`, opened: current first.
    pub fn secrets(&self, name: &str, now: i64) -> Result<Vec<(StoredSecret, String)>, VaultError> {
        self.store
            .subscription_secrets(name, now)?
            .into_iter()
            .map(|kept| {
                let open = self.open(name, &kept)?;
                Ok((kept, open))
            })
            .collect()
    }

    /// Every secret of every live subscription opens with this node's key: a node that cannot
    /// read them (no key, or another: a database copied from elsewhere, a node set up apart)
    /// says so when it starts, naming a subscription, instead of failing each call, claim or
    /// secret shown of that subscription later.
    pub fn check_all(&self, now: i64) -> Result<(), VaultError> {
        for sub in self.store.subscription_ids()? {
            self.secrets(&sub.1, now)?;
        }
        Ok(())
    }

    /// The signing secrets of an `http` subscription, current first (`GET .../secret`).
    pub fn signing_secrets(&self, name: &str, now: i64) -> Result<Vec<String>, VaultError> {
        let kind = self.kind_of(name)?;
        match kind {
            Kind::Http => {}
            Kind::Pull => {
                return Err(VaultError::Conflict(format!(
                    "`{name}` is a pull subscription: its token is kept only as a digest and \
                     cannot be shown; rotate it for a new one (shown once)"
                )));
            }
            other => {
                return Err(VaultError::Conflict(format!(
                    "`{name}` is of kind {}, which has no secret",
                    other.as_str()
                )));
            }
        }
        Ok(self
            .secrets(name, now)?
            .into_iter()
            .filter(|(k, _)| k.purpose == Purpose::Signing)
            .map(|(_, open)| open)
            .collect())
    }

    fn kind_of(&self, name: &str) -> Result<Kind, VaultError> {
        self.store
            .registry()?
            .into_iter()
            .find(|s| s.name == name)
            .map(|s| s.kind)
            .ok_or_else(|| VaultError::NotFound(name.into()))
    }

    /// Make a new secret for `name` (a signing secret for `http`, a token for `pull`); the one
    /// before stays valid for `grace_ms`.
    pub fn rotate(&self, name: &str, grace_ms: i64, now: i64) -> Result<Rotated, VaultError> {
        let (purpose, secret) = match self.kind_of(name)? {
            Kind::Http => (Purpose::Signing, new_signing_secret()),
            Kind::Pull => (Purpose::Token, new_token()),
            other => {
                return Err(VaultError::Conflict(format!(
                    "`{name}` is of kind {}, which has no secret to rotate",
                    other.as_str()
                )));
            }
        };
        let kept = self.kept_form(name, purpose, &secret);
        match self
            .store
            .rotate_secret(name, purpose, &kept, grace_ms, now)?
        {
            Rotation::Rotated { previous_until } => Ok(Rotated {
                purpose,
                secret,
                previous_until,
            }),
            Rotation::HeldByConfig => Err(VaultError::Conflict(format!(
                "the {} of `{name}` is given in a node's config: change it there (a list of \
                 secrets signs with each while receivers move)",
                purpose_words(purpose)
            ))),
            Rotation::NoSecret => Err(VaultError::Conflict(format!(
                "`{name}` has no {} yet: a node that serves it makes one when it starts",
                purpose_words(purpose)
            ))),
        }
    }
}

fn purpose_words(purpose: Purpose) -> &'static str {
    match purpose {
        Purpose::Signing => "signing secret",
        Purpose::Token => "token",
        Purpose::Claims => "claims key",
    }
}
