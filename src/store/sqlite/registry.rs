//! The registry's writes on SQLite beyond a node's sync: one subscription's row written whole
//! (the sync's and the API's), the API's create, update and remove, each in one `BEGIN
//! IMMEDIATE` transaction, so that it reads what it changes under the write lock, and the
//! heartbeat's upkeep. Secrets are `store::secrets`'.

use rusqlite::{OptionalExtension, Transaction, params};

use super::subscriptions::{bump, finish_removed, load};
use crate::store::StoreResult;
use crate::store::registry::{Change, Created, LEFT_UNFINISHED_SQL, Updated};
use crate::store::routes;
use crate::store::secrets::Purpose;
use crate::subscriptions::{HttpSettings, Subscription};

/// Every column of subscription `id` but its life (`start_after_seq`, `created_at`,
/// `removed_at`, `paused`) as `sub` says, from `origin`. Its breaker is kept, unless its
/// `settings` (where and how it delivers) changed: the failures that opened it were the old
/// target's, and a probe a lease away (one given back untried by a forwarder the change
/// stopped) would hold the corrected subscription back that long.
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
                settings = ?13, origin = ?14, filter = ?15, claimer = ?16,
                transform = ?17,
                probe_at = CASE WHEN settings IS ?13 THEN probe_at END,
                probe_interval_ms = CASE WHEN settings IS ?13 THEN probe_interval_ms END
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
        routes::filter_column(sub),
        sub.kind.claimer().as_str(),
        sub.transform.as_ref().map(|t| t.as_str()),
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

/// Whether a pull token among `secrets` (a digest) is another live subscription's, asked before
/// the create writes anything (the write transaction commits whatever `Ok` it returns).
fn token_taken(
    tx: &Transaction<'_>,
    name: &str,
    secrets: &[(Purpose, String)],
) -> StoreResult<bool> {
    for (purpose, value) in secrets {
        if *purpose != Purpose::Token {
            continue;
        }
        let taken: bool = tx.query_row(
            "SELECT EXISTS (SELECT 1 FROM subscription_secrets k
                              JOIN subscriptions s ON s.name = k.name AND s.removed_at IS NULL
                             WHERE k.purpose = 'token' AND k.value = ?1 AND k.name <> ?2)",
            params![value, name],
            |r| r.get(0),
        )?;
        if taken {
            return Ok(true);
        }
    }
    Ok(false)
}

pub(super) fn create(
    tx: &Transaction<'_>,
    sub: &Subscription,
    secrets: &[(Purpose, String)],
    origin: &str,
    now: i64,
) -> StoreResult<Created> {
    let existing: Option<(i64, bool)> = tx
        .query_row(
            "SELECT id, removed_at IS NULL FROM subscriptions WHERE name = ?1",
            [&sub.name],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    if matches!(existing, Some((_, true))) {
        return Ok(Created::Taken);
    }
    if token_taken(tx, &sub.name, secrets)? {
        return Ok(Created::TokenTaken);
    }
    let id = match existing {
        // A name removed earlier: a new subscription from now on, its old history kept.
        Some((id, _)) => {
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
    write_row(tx, id, sub, origin)?;
    // A session is seen from its start; no other subscription is timed.
    tx.execute(
        "UPDATE subscriptions SET seen_at = CASE WHEN origin = 'session' THEN ?2 END
          WHERE id = ?1",
        params![id, now],
    )?;
    tx.execute(
        "DELETE FROM subscription_secrets WHERE name = ?1",
        [&sub.name],
    )?;
    for (purpose, value) in secrets {
        tx.execute(
            "INSERT INTO subscription_secrets (name, purpose, value, created_at)
             VALUES (?1, ?2, ?3, ?4)",
            params![sub.name, purpose.as_str(), value, now],
        )?;
    }
    bump(tx)?;
    Ok(Created::Created(id))
}

pub(super) fn update(tx: &Transaction<'_>, name: &str, change: Change<'_>) -> StoreResult<Updated> {
    // Read in the writing transaction: a change made meanwhile by another node or thread is
    // either all seen here or all after this one.
    let routes = load(tx)?;
    let Some(live) = routes.named(name) else {
        return Ok(Updated::NotFound);
    };
    let current = live.subscription(None, None);
    let new = match change(&current) {
        Ok(new) => new,
        Err(refused) => return Ok(Updated::Refused(refused)),
    };
    // A session stays one; any other subscription changed through the API becomes `api`.
    let origin = if live.is_session() {
        routes::ORIGIN_SESSION
    } else {
        "api"
    };
    write_row(tx, live.id, &new, origin)?;
    bump(tx)?;
    Ok(Updated::Updated(Box::new(new)))
}

pub(super) fn remove(
    tx: &Transaction<'_>,
    name: &str,
    sessions_only: bool,
    now: i64,
) -> StoreResult<Option<usize>> {
    let Some(id) = tx
        .query_row(
            "SELECT id FROM subscriptions
              WHERE name = ?1 AND removed_at IS NULL AND (NOT ?2 OR origin = 'session')",
            params![name, sessions_only],
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

/// A session claimed: it is not idle (see [`prune_sessions`]).
pub(super) fn session_seen(tx: &Transaction<'_>, id: i64, now: i64) -> StoreResult<()> {
    tx.prepare_cached(
        "UPDATE subscriptions SET seen_at = ?2
          WHERE id = ?1 AND origin = 'session' AND removed_at IS NULL",
    )?
    .execute(params![id, now])?;
    Ok(())
}

/// Remove the sessions not seen since `idle_before`, as a `DELETE` would: their states
/// finished, their secrets forgotten. Returns how many.
pub(super) fn prune_sessions(
    tx: &Transaction<'_>,
    idle_before: i64,
    now: i64,
) -> StoreResult<usize> {
    let idle: Vec<String> = tx
        .prepare_cached(IDLE_SESSIONS_SQL)?
        .query_map([idle_before], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    for name in &idle {
        remove(tx, name, true, now)?;
    }
    Ok(idle.len())
}

/// The live sessions not seen since `?1`.
const IDLE_SESSIONS_SQL: &str = "SELECT name FROM subscriptions
  WHERE origin = 'session' AND removed_at IS NULL AND coalesce(seen_at, created_at) < ?1
  ORDER BY id";

/// Finish what removed subscriptions still hold (see `registry::LEFT_UNFINISHED_SQL`): on
/// SQLite a removal finishes its states in its own transaction, so this finds something only
/// in a database written otherwise (an older version, a copy, a hand edit). Returns how many
/// states were finished.
pub(super) fn finish_left_unfinished(tx: &Transaction<'_>, now: i64) -> StoreResult<usize> {
    let ids: Vec<i64> = tx
        .prepare_cached(LEFT_UNFINISHED_SQL)?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let mut finished = 0;
    for id in ids {
        finished += super::subscriptions::finish_removed(tx, id, now)?;
    }
    Ok(finished)
}
