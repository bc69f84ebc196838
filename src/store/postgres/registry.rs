//! The registry's writes on PostgreSQL beyond a node's sync (as SQLite's `registry.rs`): one
//! subscription's row written whole, the API's create, update and remove, and the
//! heartbeat's upkeep (secrets are `store::secrets`'). Each takes the registry's locks first, as a sync does (every subscription row, then
//! the fan-out's and the ingest's advisory locks): two changes of one subscription run one
//! after the other, each reading what it changes under those locks, and a new subscription's
//! `start_after_seq` is read with no insert or fan-out in flight.

use super::session::Db;
use super::subscriptions::{bump, load, lock_registry};
use crate::store::StoreResult;
use crate::store::registry::{Change, Created, LEFT_UNFINISHED_SQL, Updated};
use crate::store::routes;
use crate::store::secrets::Purpose;
use crate::subscriptions::{HttpSettings, Subscription};

/// Every column of subscription `id` but its life, as `sub` says, from `origin`; its breaker
/// is closed when its `settings` changed (as SQLite's `write_row` says why).
pub(super) fn write_row(
    db: &mut Db<'_>,
    id: i64,
    sub: &Subscription,
    origin: &str,
) -> StoreResult<()> {
    let rules = routes::Rules::of(sub);
    let except = serde_json::to_string(&sub.route.except_types).unwrap_or_else(|_| "[]".into());
    db.execute(
        "UPDATE subscriptions SET kind = $2, lane = $3, sources = $4, types = $5,
                except_types = $6, ordered_by = $7, on_failure = $8, mode = $9,
                max_attempts = $10, backoff_base_ms = $11, backoff_max_ms = $12,
                settings = $13, origin = $14, filter = $15, claimer = $16,
                transform = $17,
                probe_at = CASE WHEN settings IS NOT DISTINCT FROM $13 THEN probe_at END,
                probe_interval_ms =
                    CASE WHEN settings IS NOT DISTINCT FROM $13 THEN probe_interval_ms END
          WHERE id = $1",
        &[
            &id,
            &sub.kind.as_str(),
            &sub.kind.lane(),
            &routes::json_list(&sub.route.sources),
            &routes::json_list(&sub.route.types),
            &except,
            &sub.ordering.as_ref().map(|o| o.pointer.as_str()),
            &sub.ordering
                .as_ref()
                .map_or("hold", |o| o.on_failure.as_str()),
            &rules.mode.as_str(),
            &i64::from(rules.max_attempts),
            &i64::try_from(rules.backoff_base_ms).unwrap_or(i64::MAX),
            &i64::try_from(rules.backoff_max_ms).unwrap_or(i64::MAX),
            &HttpSettings::column(sub),
            &origin,
            &routes::filter_column(sub),
            &sub.kind.claimer().as_str(),
            &sub.transform.as_ref().map(|t| t.as_str()),
        ],
    )?;
    Ok(())
}

pub(super) fn create(
    db: &mut Db<'_>,
    sub: &Subscription,
    secrets: &[(Purpose, String)],
    origin: &str,
    now: i64,
) -> StoreResult<Created> {
    lock_registry(db)?;
    let existing = db.query_opt(
        "SELECT id, removed_at IS NULL FROM subscriptions WHERE name = $1",
        &[&sub.name],
    )?;
    if let Some(row) = &existing
        && row.try_get::<_, bool>(1)?
    {
        return Ok(Created::Taken);
    }
    // Under the registry's lock: two creates at once cannot both take one token.
    for (purpose, digest) in secrets {
        if *purpose == Purpose::Token
            && db
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM subscription_secrets k
                                      JOIN subscriptions s ON s.name = k.name
                                                          AND s.removed_at IS NULL
                                     WHERE k.purpose = 'token' AND k.value = $1 AND k.name <> $2)",
                    &[digest, &sub.name],
                )?
                .try_get::<_, bool>(0)?
        {
            return Ok(Created::TokenTaken);
        }
    }
    let newest = "coalesce(pg_sequence_last_value(pg_get_serial_sequence('event_log', 'seq')), 0)";
    let id: i64 = match existing {
        // A name removed earlier: a new subscription from now on, its old history kept.
        Some(row) => {
            let id: i64 = row.try_get(0)?;
            db.execute(
                &format!(
                    "UPDATE subscriptions SET removed_at = NULL, paused = false, probe_at = NULL,
                            probe_interval_ms = NULL, created_at = $2, start_after_seq = {newest}
                      WHERE id = $1"
                ),
                &[&id, &now],
            )?;
            id
        }
        None => db
            .query_one(
                &format!(
                    "INSERT INTO subscriptions (name, kind, lane, start_after_seq, created_at)
                     VALUES ($1, $2, $3, {newest}, $4) RETURNING id"
                ),
                &[&sub.name, &sub.kind.as_str(), &sub.kind.lane(), &now],
            )?
            .try_get(0)?,
    };
    write_row(db, id, sub, origin)?;
    // A session is seen from its start; no other subscription is timed.
    db.execute(
        "UPDATE subscriptions SET seen_at = CASE WHEN origin = 'session' THEN $2::bigint END
          WHERE id = $1",
        &[&id, &now],
    )?;
    db.execute(
        "DELETE FROM subscription_secrets WHERE name = $1",
        &[&sub.name],
    )?;
    for (purpose, value) in secrets {
        db.execute(
            "INSERT INTO subscription_secrets (name, purpose, value, created_at)
             VALUES ($1, $2, $3, $4)",
            &[&sub.name, &purpose.as_str(), value, &now],
        )?;
    }
    bump(db)?;
    Ok(Created::Created(id))
}

pub(super) fn update(db: &mut Db<'_>, name: &str, change: Change<'_>) -> StoreResult<Updated> {
    lock_registry(db)?;
    let routes = load(db)?;
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
    write_row(db, live.id, &new, origin)?;
    bump(db)?;
    Ok(Updated::Updated(Box::new(new)))
}

/// Mark `name` removed and forget its secrets: its id, for its states to be finished after
/// the commit (see `subscriptions::finish_removed`).
pub(super) fn remove(
    db: &mut Db<'_>,
    name: &str,
    sessions_only: bool,
    now: i64,
) -> StoreResult<Option<i64>> {
    lock_registry(db)?;
    let Some(row) = db.query_opt(
        "UPDATE subscriptions SET removed_at = $2
          WHERE name = $1 AND removed_at IS NULL AND (NOT $3 OR origin = 'session')
          RETURNING id",
        &[&name, &now, &sessions_only],
    )?
    else {
        return Ok(None);
    };
    db.execute("DELETE FROM subscription_secrets WHERE name = $1", &[&name])?;
    bump(db)?;
    Ok(Some(row.try_get(0)?))
}

/// A session claimed: it is not idle (see [`idle_sessions`]). No lock of the registry: the
/// row's own lock, and no version moved (nothing a node serves changed).
pub(super) fn session_seen(db: &mut Db<'_>, id: i64, now: i64) -> StoreResult<()> {
    db.execute(
        "UPDATE subscriptions SET seen_at = $2
          WHERE id = $1 AND origin = 'session' AND removed_at IS NULL",
        &[&id, &now],
    )?;
    Ok(())
}

/// The live sessions not seen since `idle_before`: the heartbeat removes each as a `DELETE`
/// does (see `Store::prune_subscriptions`).
pub(super) fn idle_sessions(db: &mut Db<'_>, idle_before: i64) -> StoreResult<Vec<String>> {
    Ok(db
        .query(
            "SELECT name FROM subscriptions
              WHERE origin = 'session' AND removed_at IS NULL
                AND coalesce(seen_at, created_at) < $1
              ORDER BY id",
            &[&idle_before],
        )?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()?)
}

/// The removed subscriptions that still hold pending or claimed states: a node that died
/// between a removal's commit and the transaction that finishes its states (see
/// `subscriptions::finish_removed`) left them. The heartbeat finishes them.
pub(super) fn left_unfinished(db: &mut Db<'_>) -> StoreResult<Vec<i64>> {
    Ok(db
        .query(LEFT_UNFINISHED_SQL, &[])?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()?)
}
