//! The registry's reads and writes beyond a node's sync, on either store: the live
//! subscriptions' rows, one row written whole (the sync's and the API's), the API's create,
//! update and remove, pause, and the heartbeat's reads. Every change runs after the store's
//! [`Conn::lock_registry`] and moves the registry's version on. Secrets are
//! `store::secrets`'; the sync, and what a removal finishes, stay per store (their locking
//! differs).

use super::{Conn, Dialect, Row, Value};
use crate::store::StoreResult;
use crate::store::registry::{Change, Created, LEFT_UNFINISHED_SQL, Updated};
use crate::store::routes::{self, Live};
use crate::store::secrets::Purpose;
use crate::subscriptions::{HttpSettings, Kind, Subscription};

/// The live subscriptions as the table has them, in id order.
pub fn live(conn: &mut impl Conn) -> StoreResult<Vec<Live>> {
    conn.query(
        &format!(
            "SELECT id, name, lane, sources, types, except_types, start_after_seq, ordered_by,
                    on_failure, {}
               FROM subscriptions WHERE removed_at IS NULL ORDER BY id",
            routes::RULE_COLUMNS
        ),
        &[],
    )?
    .iter()
    .map(live_of)
    .collect()
}

fn live_of(r: &Row) -> StoreResult<Live> {
    let name = r.text(1)?;
    Ok(Live {
        id: r.int(0)?,
        lane: r.int(2)?,
        route: route_of(r, 3)?,
        start_after_seq: r.int(6)?,
        ordered: routes::Ordered::from_row(r.opt_text(7)?, &r.text(8)?),
        kind: Kind::parse(&r.text(9)?).unwrap_or(Kind::Audit),
        rules: routes::Rules::from_row(&r.text(10)?, r.int(11)?, r.int(12)?, r.int(13)?),
        settings: HttpSettings::parse(r.opt_text(14)?.as_deref()),
        origin: r.text(15)?,
        filter: routes::filter_from_row(&name, r.opt_text(16)?.as_deref()),
        transform: routes::transform_from_row(r.opt_text(17)?.as_deref()),
        name,
    })
}

/// The route kept in columns `at`, `at + 1` and `at + 2` (sources, types, except types).
pub fn route_of(r: &Row, at: usize) -> StoreResult<crate::subscriptions::Route> {
    Ok(routes::route_from(
        r.opt_text(at)?,
        r.opt_text(at + 1)?,
        r.opt_text(at + 2)?,
    ))
}

/// Move the registry's version on: every node's next claim reads the subscriptions again.
pub fn bump(conn: &mut impl Conn) -> StoreResult<()> {
    conn.execute(
        "UPDATE subscription_registry SET version = version + 1 WHERE id = 0",
        &[],
    )?;
    Ok(())
}

/// Every column of subscription `id` but its life (`start_after_seq`, `created_at`,
/// `removed_at`, `paused`) as `sub` says, from `origin`. Its breaker is kept, unless its
/// `settings` (where and how it delivers) changed: the failures that opened it were the old
/// target's, and a probe a lease away (one given back untried by a forwarder the change
/// stopped) would hold the corrected subscription back that long.
pub fn write_row(
    conn: &mut impl Conn,
    id: i64,
    sub: &Subscription,
    origin: &str,
) -> StoreResult<()> {
    let rules = routes::Rules::of(sub);
    let text = |s: &str| Value::Text(s.into());
    let ordering = sub.ordering.as_ref();
    conn.execute(
        "UPDATE subscriptions SET kind = ?2, lane = ?3, sources = ?4, types = ?5,
                except_types = ?6, ordered_by = ?7, on_failure = ?8, mode = ?9,
                max_attempts = ?10, backoff_base_ms = ?11, backoff_max_ms = ?12,
                settings = ?13, origin = ?14, filter = ?15, claimer = ?16,
                transform = ?17,
                probe_at = CASE WHEN settings IS NOT DISTINCT FROM ?13 THEN probe_at END,
                probe_interval_ms =
                    CASE WHEN settings IS NOT DISTINCT FROM ?13 THEN probe_interval_ms END
          WHERE id = ?1",
        &[
            Value::Int(id),
            text(sub.kind.as_str()),
            Value::Int(sub.kind.lane()),
            routes::json_list(&sub.route.sources).as_deref().into(),
            routes::json_list(&sub.route.types).as_deref().into(),
            text(&serde_json::to_string(&sub.route.except_types).unwrap_or_else(|_| "[]".into())),
            ordering.map(|o| o.pointer.as_str()).into(),
            text(ordering.map_or("hold", |o| o.on_failure.as_str())),
            text(rules.mode.as_str()),
            Value::Int(i64::from(rules.max_attempts)),
            Value::Int(i64::try_from(rules.backoff_base_ms).unwrap_or(i64::MAX)),
            Value::Int(i64::try_from(rules.backoff_max_ms).unwrap_or(i64::MAX)),
            HttpSettings::column(sub).as_deref().into(),
            text(origin),
            routes::filter_column(sub).as_deref().into(),
            text(sub.kind.claimer().as_str()),
            sub.transform.as_ref().map(|t| t.as_str()).into(),
        ],
    )?;
    Ok(())
}

/// A new row for `sub`, taking the events stored after now; its columns come from
/// [`write_row`].
pub fn insert_row<C: Conn>(conn: &mut C, sub: &Subscription, now: i64) -> StoreResult<i64> {
    conn.query_one(
        &format!(
            "INSERT INTO subscriptions (name, kind, lane, start_after_seq, created_at)
             VALUES (?1, ?2, ?3, {}, ?4) RETURNING id",
            C::Dialect::NEWEST_SEQ
        ),
        &[
            Value::Text(sub.name.clone()),
            Value::Text(sub.kind.as_str().into()),
            Value::Int(sub.kind.lane()),
            Value::Int(now),
        ],
    )?
    .int(0)
}

/// Whether a pull token among `secrets` (a digest) is another live subscription's, asked
/// before the create writes anything, under the registry's lock: two creates at once cannot
/// both take one token.
fn token_taken(
    conn: &mut impl Conn,
    name: &str,
    secrets: &[(Purpose, String)],
) -> StoreResult<bool> {
    for (purpose, value) in secrets {
        if *purpose == Purpose::Token
            && conn
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM subscription_secrets k
                                      JOIN subscriptions s ON s.name = k.name
                                                          AND s.removed_at IS NULL
                                     WHERE k.purpose = 'token' AND k.value = ?1 AND k.name <> ?2)",
                    &[Value::Text(value.clone()), Value::Text(name.into())],
                )?
                .bool(0)?
        {
            return Ok(true);
        }
    }
    Ok(false)
}

pub fn create<C: Conn>(
    conn: &mut C,
    sub: &Subscription,
    secrets: &[(Purpose, String)],
    origin: &str,
    now: i64,
) -> StoreResult<Created> {
    conn.lock_registry()?;
    let name = Value::Text(sub.name.clone());
    let existing = conn.query_opt(
        "SELECT id, removed_at IS NULL FROM subscriptions WHERE name = ?1",
        std::slice::from_ref(&name),
    )?;
    if let Some(row) = &existing
        && row.bool(1)?
    {
        return Ok(Created::Taken);
    }
    if token_taken(conn, &sub.name, secrets)? {
        return Ok(Created::TokenTaken);
    }
    let id = match existing {
        // A name removed earlier: a new subscription from now on, its old history kept.
        Some(row) => {
            let id = row.int(0)?;
            conn.execute(
                &format!(
                    "UPDATE subscriptions SET removed_at = NULL, paused = {}, probe_at = NULL,
                            probe_interval_ms = NULL, created_at = ?2, start_after_seq = {}
                      WHERE id = ?1",
                    C::Dialect::NONE,
                    C::Dialect::NEWEST_SEQ
                ),
                &[Value::Int(id), Value::Int(now)],
            )?;
            id
        }
        None => insert_row(conn, sub, now)?,
    };
    write_row(conn, id, sub, origin)?;
    // A session is seen from its start; no other subscription is timed.
    conn.execute(
        "UPDATE subscriptions SET seen_at = CASE WHEN origin = 'session' THEN CAST(?2 AS BIGINT) END
          WHERE id = ?1",
        &[Value::Int(id), Value::Int(now)],
    )?;
    conn.execute(
        "DELETE FROM subscription_secrets WHERE name = ?1",
        std::slice::from_ref(&name),
    )?;
    for (purpose, value) in secrets {
        conn.execute(
            "INSERT INTO subscription_secrets (name, purpose, value, created_at)
             VALUES (?1, ?2, ?3, ?4)",
            &[
                name.clone(),
                Value::Text(purpose.as_str().into()),
                Value::Text(value.clone()),
                Value::Int(now),
            ],
        )?;
    }
    bump(conn)?;
    Ok(Created::Created(id))
}

/// Read in the writing transaction, under the registry's lock: a change made meanwhile by
/// another node or thread is either all seen here or all after this one.
pub fn update(conn: &mut impl Conn, name: &str, change: Change<'_>) -> StoreResult<Updated> {
    conn.lock_registry()?;
    let live = live(conn)?;
    let Some(live) = live.iter().find(|s| s.name == name) else {
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
    write_row(conn, live.id, &new, origin)?;
    bump(conn)?;
    Ok(Updated::Updated(Box::new(new)))
}

/// Mark `name` removed and forget its secrets: its id, for the store to finish its states
/// (SQLite in the same transaction, PostgreSQL after the commit).
pub fn remove(
    conn: &mut impl Conn,
    name: &str,
    sessions_only: bool,
    now: i64,
) -> StoreResult<Option<i64>> {
    conn.lock_registry()?;
    let Some(row) = conn.query_opt(
        "UPDATE subscriptions SET removed_at = ?2
          WHERE name = ?1 AND removed_at IS NULL AND (NOT ?3 OR origin = 'session')
          RETURNING id",
        &[
            Value::Text(name.into()),
            Value::Int(now),
            Value::Int(i64::from(sessions_only)),
        ],
    )?
    else {
        return Ok(None);
    };
    conn.execute(
        "DELETE FROM subscription_secrets WHERE name = ?1",
        &[Value::Text(name.into())],
    )?;
    bump(conn)?;
    Ok(Some(row.int(0)?))
}

/// A session claimed: it is not idle (see [`idle_sessions`]). No lock of the registry and no
/// version moved: nothing a node serves changed.
pub fn session_seen(conn: &mut impl Conn, id: i64, now: i64) -> StoreResult<()> {
    conn.execute(
        "UPDATE subscriptions SET seen_at = ?2
          WHERE id = ?1 AND origin = 'session' AND removed_at IS NULL",
        &[Value::Int(id), Value::Int(now)],
    )?;
    Ok(())
}

/// The live sessions not seen since `idle_before`: the heartbeat removes each as a `DELETE`
/// does (see `Store::prune_subscriptions`).
pub fn idle_sessions(conn: &mut impl Conn, idle_before: i64) -> StoreResult<Vec<String>> {
    conn.query(
        "SELECT name FROM subscriptions
          WHERE origin = 'session' AND removed_at IS NULL AND coalesce(seen_at, created_at) < ?1
          ORDER BY id",
        &[Value::Int(idle_before)],
    )?
    .iter()
    .map(|r| r.text(0))
    .collect()
}

/// The removed subscriptions that still hold pending or claimed states (see
/// [`LEFT_UNFINISHED_SQL`]): the heartbeat finishes them.
pub fn left_unfinished(conn: &mut impl Conn) -> StoreResult<Vec<i64>> {
    conn.query(LEFT_UNFINISHED_SQL, &[])?
        .iter()
        .map(|r| r.int(0))
        .collect()
}

pub fn set_paused(conn: &mut impl Conn, name: &str, paused: bool) -> StoreResult<bool> {
    Ok(conn.execute(
        "UPDATE subscriptions SET paused = ?2 WHERE name = ?1 AND removed_at IS NULL",
        &[Value::Text(name.into()), Value::Int(i64::from(paused))],
    )? == 1)
}
