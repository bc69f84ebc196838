//! Subscriptions' secrets in the store (SPEC section 13, "One registry"): made once and shared
//! by every node, rotated with a grace, and never kept in a form that gives them away when it
//! need not. What each purpose keeps:
//!
//! - `signing`: an `http` subscription's Standard Webhooks secret. The nodes must sign with it,
//!   so it is kept whole: plain, or sealed under the nodes' secrets key (`crate::secrets`).
//! - `token`: a `pull` subscription's bearer token, kept only as its SHA-256 digest
//!   ([`token_digest`]): shown once, when made or rotated, and checked against the digest.
//! - `claims`: the key that MACs a pull subscription's claim tokens, so that any node verifies
//!   any node's (the bearer token could be that key no longer, as no node knows it).
//!
//! A purpose has one current secret (`expires_at` NULL) and, after a rotation, older ones that
//! stay valid until their `expires_at` (the grace); the heartbeat deletes expired ones. A
//! secret given in a node's config is kept with origin `config` and is not rotated by the API.

use sha2::{Digest, Sha256};

/// The mark of a value sealed by `crate::secrets::seal`: `sealed1:` then base64 of the nonce
/// and the ciphertext. Part of the row's format, so that the store tells a sealed value from a
/// plain one (a copy names the subscriptions whose secrets need the source's key) without
/// reading the module that seals.
pub const SEALED: &str = "sealed1:";

/// Whether a kept value is sealed (it opens only with the key it was sealed with).
pub fn is_sealed(kept: &str) -> bool {
    kept.starts_with(SEALED)
}

/// What a secret is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    Signing,
    Token,
    Claims,
}

impl Purpose {
    pub fn as_str(self) -> &'static str {
        match self {
            Purpose::Signing => "signing",
            Purpose::Token => "token",
            Purpose::Claims => "claims",
        }
    }

    pub fn parse(s: &str) -> Option<Purpose> {
        [Purpose::Signing, Purpose::Token, Purpose::Claims]
            .into_iter()
            .find(|p| p.as_str() == s)
    }
}

/// One kept secret, as the store holds it: `value` is what was given to keep (a sealed or
/// plain signing secret, a token's digest, a claims key).
#[derive(Clone, PartialEq, Eq)]
pub struct StoredSecret {
    pub purpose: Purpose,
    pub value: String,
    /// Given in a node's config (not rotated by the API), rather than made by a node.
    pub from_config: bool,
    pub created_at: i64,
    /// `None`: the current one. Else valid until then (a rotation's grace).
    pub expires_at: Option<i64>,
}

impl std::fmt::Debug for StoredSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredSecret")
            .field("purpose", &self.purpose)
            .field("value", &"[redacted]")
            .field("from_config", &self.from_config)
            .field("created_at", &self.created_at)
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

/// What [`Store::rotate_secret`](super::Store::rotate_secret) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rotation {
    /// The new secret is current; the one before stays valid until `previous_until`.
    Rotated { previous_until: i64 },
    /// The subscription has no secret of that purpose to rotate.
    NoSecret,
    /// A node's config gives the current secret: the config is where it changes.
    HeldByConfig,
}

/// The longest grace a rotation may give the old secret: 30 days.
pub const MAX_GRACE_MS: i64 = 30 * 24 * 3_600_000;

/// How a pull token is kept: `sha256:` and the hex of its SHA-256.
pub fn token_digest(token: &str) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(token.as_bytes())))
}

/// The key earlier versions derived from a pull token for its claim tokens: a token kept plain
/// before this version gets it as its `claims` key, so that claims made before the upgrade
/// still ack (new subscriptions get a random one).
pub fn claims_key_of(token: &str) -> [u8; 32] {
    Sha256::new()
        .chain_update(b"webhook-inbox pull claims\0")
        .chain_update(token.as_bytes())
        .finalize()
        .into()
}

/// The columns a kept secret is read with, in [`StoredSecret`]'s order.
pub const COLUMNS: &str = "purpose, value, origin = 'config', created_at, expires_at";

/// A kept secret from its values (`purpose` as stored).
pub fn stored(
    purpose: &str,
    value: String,
    from_config: bool,
    created_at: i64,
    expires_at: Option<i64>,
) -> Option<StoredSecret> {
    Some(StoredSecret {
        purpose: Purpose::parse(purpose)?,
        value,
        from_config,
        created_at,
        expires_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The digest and the derived key as PostgreSQL's migration 0009 computes them in SQL.
    #[test]
    fn the_digest_and_the_derived_key_are_the_known_ones() {
        assert_eq!(
            token_digest("abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            claims_key_of("abc"),
            <[u8; 32]>::from(Sha256::digest(b"webhook-inbox pull claims\0abc".as_slice()))
        );
    }
}
