//! A node's start: the secrets of the subscriptions its config names, made or applied once in
//! the store (see the module above).

use std::collections::HashMap;

use super::Vault;
use crate::config::Settings;
use crate::domain::time::now_ms;
use crate::store::secrets::{Purpose, claims_key_of, token_digest};
use crate::subscriptions::{Kind, Subscription};

/// Apply the secrets the config gives, make the ones it does not (once, whichever node is
/// first), and fill in what this node knows of them: an `http` subscription's signing secrets
/// (its file, as before), a `pull` one's token where this node made it (its file) or the
/// config gives it. Returns each pull subscription's claims key.
pub fn prepare(
    settings: &Settings,
    vault: &Vault,
    subs: &mut [Subscription],
) -> anyhow::Result<HashMap<String, [u8; 32]>> {
    let mut claims_keys = HashMap::new();
    for sub in subs.iter_mut() {
        let name = sub.name.clone();
        // A `nats` subscription publishes unsigned: the broker's credentials authenticate it.
        if let Some(target) = sub.http.as_mut().filter(|_| sub.kind == Kind::Http) {
            if target.signing_secrets.is_empty() {
                let (secret, path) = crate::config::subscription_secret(settings, &name, |c| {
                    let kept = vault.kept_form(&name, Purpose::Signing, c);
                    let kept = vault
                        .store
                        .keep_secret(&name, Purpose::Signing, &kept, now_ms())?;
                    Ok(vault.open(&name, &kept)?)
                })?;
                tracing::info!(subscription = %name, file = %path.display(),
                    "signing with the generated secret kept in this file");
                target.signing_secrets.push(secret);
            } else {
                let given: Vec<String> = target
                    .signing_secrets
                    .iter()
                    .map(|s| s.expose().to_string())
                    .collect();
                apply_config(vault, &name, Purpose::Signing, &given)?;
            }
        }
        if sub.kind != Kind::Pull {
            continue;
        }
        let key_from = match &sub.token {
            Some(token) => {
                apply_config(vault, &name, Purpose::Token, &[token.expose().to_string()])?;
                Some(token.expose().to_string())
            }
            None => {
                let made = crate::config::subscription_token(settings, &name, |candidate| {
                    let digest = token_digest(candidate);
                    let kept = vault
                        .store
                        .keep_secret(&name, Purpose::Token, &digest, now_ms())?;
                    Ok(kept.value == digest)
                })?;
                match made {
                    Some((token, path)) => {
                        tracing::info!(subscription = %name, file = %path.display(),
                            "pull clients use the generated token kept in this file");
                        let plain = token.expose().to_string();
                        sub.token = Some(token);
                        Some(plain)
                    }
                    None => {
                        tracing::info!(subscription = %name,
                            "the pull token was made by another node or rotated since: it is \
                             kept only as a digest; `subscriptions rotate-secret` shows a new one");
                        None
                    }
                }
            }
        };
        // Claims made under the key earlier versions derived from the token still ack.
        let key = vault.claims_key(&name, key_from.map(|token| claims_key_of(&token)))?;
        claims_keys.insert(name, key);
    }
    Ok(claims_keys)
}

/// The config gives these secrets: the store follows it unless it holds them already (as a
/// config's), so that nodes with one config do not rewrite them at each start.
fn apply_config(
    vault: &Vault,
    name: &str,
    purpose: Purpose,
    given: &[String],
) -> anyhow::Result<()> {
    let now = now_ms();
    let held: Vec<String> = vault
        .secrets(name, now)?
        .into_iter()
        .filter(|(k, _)| k.purpose == purpose && k.from_config)
        .map(|(_, open)| open)
        .collect();
    let wanted: Vec<String> = match purpose {
        Purpose::Token => given.iter().map(|t| token_digest(t)).collect(),
        _ => given.to_vec(),
    };
    let same = |a: &[String], b: &[String]| {
        let (mut a, mut b) = (a.to_vec(), b.to_vec());
        a[1..].sort();
        b[1..].sort();
        a == b
    };
    if held.len() == wanted.len() && !held.is_empty() && same(&held, &wanted) {
        return Ok(());
    }
    let kept: Vec<String> = given
        .iter()
        .map(|g| vault.kept_form(name, purpose, g))
        .collect();
    vault.store.put_config_secrets(name, purpose, &kept, now)?;
    Ok(())
}
