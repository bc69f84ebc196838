//! Subscriptions' secrets (see `store::secrets`) on either store: the current one of each
//! purpose, older ones in a rotation's grace, and the upkeep that drops them after it. A
//! rotation locks the current row ([`Dialect::lock`]) so that two nodes rotating at once do
//! not both end the same secret's life and each add a current one.

use super::{Conn, Dialect, Row, Value};
use crate::store::StoreResult;
use crate::store::secrets::{self, COLUMNS, Purpose, Rotation, StoredSecret};

fn read(r: &Row) -> StoreResult<Option<StoredSecret>> {
    Ok(secrets::stored(
        &r.text(0)?,
        r.text(1)?,
        r.bool(2)?,
        r.int(3)?,
        r.opt_int(4)?,
    ))
}

fn text(s: &str) -> Value {
    Value::Text(s.into())
}

/// Every secret of `name` valid at `now`: current ones first, then the newest.
pub fn list(conn: &mut impl Conn, name: &str, now: i64) -> StoreResult<Vec<StoredSecret>> {
    let rows = conn.query(
        &format!(
            "SELECT {COLUMNS} FROM subscription_secrets
              WHERE name = ?1 AND (expires_at IS NULL OR expires_at > ?2)
              ORDER BY expires_at IS NOT NULL, created_at DESC, id DESC"
        ),
        &[text(name), Value::Int(now)],
    )?;
    let mut kept = Vec::with_capacity(rows.len());
    for row in &rows {
        kept.extend(read(row)?);
    }
    Ok(kept)
}

/// `value` becomes the current secret unless there is one; the current one either way.
pub fn keep(
    conn: &mut impl Conn,
    name: &str,
    purpose: Purpose,
    value: &str,
    now: i64,
) -> StoreResult<StoredSecret> {
    let added = conn.execute(
        "INSERT INTO subscription_secrets (name, purpose, value, created_at)
         VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (name, purpose) WHERE expires_at IS NULL DO NOTHING",
        &[
            text(name),
            text(purpose.as_str()),
            text(value),
            Value::Int(now),
        ],
    )?;
    if added > 0 {
        super::registry::bump(conn)?;
    }
    let row = conn.query_one(
        &format!(
            "SELECT {COLUMNS} FROM subscription_secrets
              WHERE name = ?1 AND purpose = ?2 AND expires_at IS NULL"
        ),
        &[text(name), text(purpose.as_str())],
    )?;
    read(&row)?.ok_or_else(|| anyhow::anyhow!("a kept secret of an unknown purpose").into())
}

/// A node's config gives `values`: they replace every kept secret of that purpose, the first
/// current, the others valid for as long as a config lists them.
pub fn put_config(
    conn: &mut impl Conn,
    name: &str,
    purpose: Purpose,
    values: &[String],
    now: i64,
) -> StoreResult<()> {
    conn.execute(
        "DELETE FROM subscription_secrets WHERE name = ?1 AND purpose = ?2",
        &[text(name), text(purpose.as_str())],
    )?;
    for (i, value) in values.iter().enumerate() {
        let expires = (i > 0).then_some(i64::MAX);
        conn.execute(
            "INSERT INTO subscription_secrets (name, purpose, value, origin, created_at,
                                               expires_at)
             VALUES (?1, ?2, ?3, 'config', ?4, ?5)",
            &[
                text(name),
                text(purpose.as_str()),
                text(value),
                Value::Int(now),
                expires.into(),
            ],
        )?;
    }
    super::registry::bump(conn)
}

/// `value` becomes current; the one before stays valid for `grace_ms` (see
/// `Store::rotate_secret`).
pub fn rotate<C: Conn>(
    conn: &mut C,
    name: &str,
    purpose: Purpose,
    value: &str,
    grace_ms: i64,
    now: i64,
) -> StoreResult<Rotation> {
    let current = conn.query_opt(
        &format!(
            "SELECT id, origin = 'config' FROM subscription_secrets
              WHERE name = ?1 AND purpose = ?2 AND expires_at IS NULL {}",
            C::Dialect::lock("subscription_secrets")
        ),
        &[text(name), text(purpose.as_str())],
    )?;
    let Some(current) = current else {
        return Ok(Rotation::NoSecret);
    };
    if current.bool(1)? {
        return Ok(Rotation::HeldByConfig);
    }
    let previous_until = now.saturating_add(grace_ms);
    conn.execute(
        "UPDATE subscription_secrets SET expires_at = ?2 WHERE id = ?1",
        &[Value::Int(current.int(0)?), Value::Int(previous_until)],
    )?;
    conn.execute(
        "INSERT INTO subscription_secrets (name, purpose, value, created_at)
         VALUES (?1, ?2, ?3, ?4)",
        &[
            text(name),
            text(purpose.as_str()),
            text(value),
            Value::Int(now),
        ],
    )?;
    super::registry::bump(conn)?;
    Ok(Rotation::Rotated { previous_until })
}

/// The heartbeat's upkeep: secrets whose grace ended are gone. Returns how many.
pub fn drop_expired(conn: &mut impl Conn, now: i64) -> StoreResult<usize> {
    let dropped = conn.execute(
        "DELETE FROM subscription_secrets WHERE expires_at <= ?1",
        &[Value::Int(now)],
    )?;
    Ok(usize::try_from(dropped).unwrap_or(usize::MAX))
}
