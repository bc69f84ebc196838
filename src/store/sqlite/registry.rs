//! The registry's writes on SQLite beyond a node's sync: one subscription's row written whole
//! (the sync's and the API's), its kept secrets, and the API's create, update and remove, each
//! in one `BEGIN IMMEDIATE` transaction, so that it reads what it changes under the write lock.

use rusqlite::{OptionalExtension, Transaction, params};

use super::subscriptions::{bump, finish_removed, load};
use crate::store::StoreResult;
use crate::store::registry::{Change, Created, KeptSecret, Updated};
use crate::store::routes;
use crate::subscriptions::{HttpSettings, Subscription};

/// Every column of subscription `id` but its life (`start_after_seq`, `created_at`,
/// `removed_at`, `paused`, the breaker) as `sub` says, from `origin`.
pub(super) fn write_row(
    tx: &Transaction<'_>,
    id: i64,
    sub: &Subscription,
    origin: &str,
) -> StoreResult<()> {
    let rules = routes::Rules::of(sub);
    tx.prepare_cached(
        "UPDATE subscriptions SET kind = ?2, lane = ?3, sources = ?4, types = ?5,
                except_types = ?6, ordered_by = ?7, on_failure = ?8, mode = ?9,
                max_attempts = ?10, backoff_base_ms = ?11, backoff_max_ms = ?12,
                settings = ?13, origin = ?14
          WHERE id = ?1",
    )?
    .execute(params![
        id,
        sub.kind.as_str(),
        sub.kind.lane(),
        routes::json_list(&sub.route.sources),
        routes::json_list(&sub.route.types),
        serde_json::to_string(&sub.route.except_types).unwrap_or_else(|_| "[]".into()),
        sub.ordering.as_ref().map(|o| o.pointer.as_str()),
        sub.ordering
            .as_ref()
            .map_or("hold", |o| o.on_failure.as_str()),
        rules.mode.as_str(),
        rules.max_attempts,
        i64::try_from(rules.backoff_base_ms).unwrap_or(i64::MAX),
        i64::try_from(rules.backoff_max_ms).unwrap_or(i64::MAX),
        HttpSettings::column(sub),
        origin,
    ])?;
    Ok(())
}

/// A new row for `sub`, taking the events stored after now; its columns come from
/// [`write_row`].
pub(super) fn insert_row(tx: &Transaction<'_>, sub: &Subscription, now: i64) -> StoreResult<i64> {
    Ok(tx.query_row(
        "INSERT INTO subscriptions (name, kind, lane, start_after_seq, created_at)
         VALUES (?1, ?2, ?3, (SELECT ifnull(max(seq), 0) FROM event_log), ?4) RETURNING id",
        params![sub.name, sub.kind.as_str(), sub.kind.lane(), now],
        |r| r.get(0),
    )?)
}

/// Keep the secrets `sub` carries (a config's or the API's; see `subscriptions::kept_secrets`)
/// as every node's: they replace the kept ones.
pub(super) fn keep_secrets(tx: &Transaction<'_>, sub: &Subscription, now: i64) -> StoreResult<()> {
    for (purpose, value) in crate::subscriptions::kept_secrets(sub) {
        tx.prepare_cached(
            "INSERT INTO subscription_secrets (name, purpose, value, created_at)
             VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (name, purpose) DO UPDATE SET value = excluded.value
              WHERE value <> excluded.value",
        )?
        .execute(params![sub.name, purpose, value, now])?;
    }
    Ok(())
}

pub(super) fn create(tx: &Transaction<'_>, sub: &Subscription, now: i64) -> StoreResult<Created> {
    let existing: Option<(i64, bool)> = tx
        .query_row(
            "SELECT id, removed_at IS NULL FROM subscriptions WHERE name = ?1",
            [&sub.name],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let id = match existing {
        Some((_, true)) => return Ok(Created::Taken),
        // A name removed earlier: a new subscription from now on, its old history kept.
        Some((id, false)) => {
            tx.execute(
                "UPDATE subscriptions SET removed_at = NULL, paused = 0, probe_at = NULL,
                        probe_interval_ms = NULL, created_at = ?2,
                        start_after_seq = (SELECT ifnull(max(seq), 0) FROM event_log)
                  WHERE id = ?1",
                params![id, now],
            )?;
            id
        }
        None => insert_row(tx, sub, now)?,
    };
    write_row(tx, id, sub, "api")?;
    keep_secrets(tx, sub, now)?;
    bump(tx)?;
    Ok(Created::Created(id))
}

pub(super) fn update(
    tx: &Transaction<'_>,
    name: &str,
    change: Change<'_>,
    now: i64,
) -> StoreResult<Updated> {
    // Read in the writing transaction: a change made meanwhile by another node or thread is
    // either all seen here or all after this one.
    let routes = load(tx)?;
    let Some(live) = routes.named(name) else {
        return Ok(Updated::NotFound);
    };
    let secrets = kept(tx, Some(name))?;
    let current = crate::store::registry::served(std::slice::from_ref(live), &secrets)
        .pop()
        .map(|(_, sub)| sub)
        .expect("one live subscription");
    let new = match change(&current) {
        Ok(new) => new,
        Err(refused) => return Ok(Updated::Refused(refused)),
    };
    write_row(tx, live.id, &new, "api")?;
    keep_secrets(tx, &new, now)?;
    bump(tx)?;
    Ok(Updated::Updated(Box::new(new)))
}

pub(super) fn remove(tx: &Transaction<'_>, name: &str, now: i64) -> StoreResult<Option<usize>> {
    let Some(id) = tx
        .query_row(
            "SELECT id FROM subscriptions WHERE name = ?1 AND removed_at IS NULL",
            [name],
            |r| r.get::<_, i64>(0),
        )
        .optional()?
    else {
        return Ok(None);
    };
    tx.execute(
        "UPDATE subscriptions SET removed_at = ?2 WHERE id = ?1",
        params![id, now],
    )?;
    let finished = finish_removed(tx, id, now)?;
    tx.execute("DELETE FROM subscription_secrets WHERE name = ?1", [name])?;
    bump(tx)?;
    Ok(Some(finished))
}

/// The kept secrets, of one subscription or of all.
pub(super) fn kept(
    conn: &rusqlite::Connection,
    name: Option<&str>,
) -> StoreResult<Vec<KeptSecret>> {
    Ok(conn
        .prepare_cached(
            "SELECT name, purpose, value FROM subscription_secrets
              WHERE ?1 IS NULL OR name = ?1 ORDER BY name, purpose",
        )?
        .query_map([name], |r| {
            Ok(KeptSecret {
                name: r.get(0)?,
                purpose: r.get(1)?,
                value: r.get(2)?,
            })
        })?
        .collect::<Result<_, _>>()?)
}
