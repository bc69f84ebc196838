//! Subscriptions' secrets on PostgreSQL (see `store::secrets`; the same statements as SQLite's
//! `secrets.rs` in this dialect).

use super::session::Db;
use crate::store::StoreResult;
use crate::store::secrets::{self, COLUMNS, Purpose, Rotation, StoredSecret};

fn read(r: &postgres::Row) -> StoreResult<Option<StoredSecret>> {
    Ok(secrets::stored(
        &r.try_get::<_, String>(0)?,
        r.try_get(1)?,
        r.try_get(2)?,
        r.try_get(3)?,
        r.try_get(4)?,
    ))
}

/// Every secret of `name` valid at `now`: current ones first, then the newest.
pub(super) fn list(db: &mut Db<'_>, name: &str, now: i64) -> StoreResult<Vec<StoredSecret>> {
    let rows = db.query(
        &format!(
            "SELECT {COLUMNS} FROM subscription_secrets
              WHERE name = $1 AND (expires_at IS NULL OR expires_at > $2)
              ORDER BY expires_at IS NOT NULL, created_at DESC, id DESC"
        ),
        &[&name, &now],
    )?;
    let mut kept = Vec::with_capacity(rows.len());
    for row in &rows {
        kept.extend(read(row)?);
    }
    Ok(kept)
}

/// `value` becomes the current secret unless there is one; the current one either way.
pub(super) fn keep(
    db: &mut Db<'_>,
    name: &str,
    purpose: Purpose,
    value: &str,
    now: i64,
) -> StoreResult<StoredSecret> {
    let added = db.execute(
        "INSERT INTO subscription_secrets (name, purpose, value, created_at)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (name, purpose) WHERE expires_at IS NULL DO NOTHING",
        &[&name, &purpose.as_str(), &value, &now],
    )?;
    if added > 0 {
        crate::store::sql::registry::bump(db)?;
    }
    let row = db.query_one(
        &format!(
            "SELECT {COLUMNS} FROM subscription_secrets
              WHERE name = $1 AND purpose = $2 AND expires_at IS NULL"
        ),
        &[&name, &purpose.as_str()],
    )?;
    read(&row)?.ok_or_else(|| anyhow::anyhow!("a kept secret of an unknown purpose").into())
}

/// A node's config gives `values`: they replace every kept secret of that purpose.
pub(super) fn put_config(
    db: &mut Db<'_>,
    name: &str,
    purpose: Purpose,
    values: &[String],
    now: i64,
) -> StoreResult<()> {
    db.execute(
        "DELETE FROM subscription_secrets WHERE name = $1 AND purpose = $2",
        &[&name, &purpose.as_str()],
    )?;
    for (i, value) in values.iter().enumerate() {
        let expires = (i > 0).then_some(i64::MAX);
        db.execute(
            "INSERT INTO subscription_secrets (name, purpose, value, origin, created_at,
                                               expires_at)
             VALUES ($1, $2, $3, 'config', $4, $5)",
            &[&name, &purpose.as_str(), value, &now, &expires],
        )?;
    }
    crate::store::sql::registry::bump(db)
}

/// `value` becomes current; the one before stays valid for `grace_ms`.
pub(super) fn rotate(
    db: &mut Db<'_>,
    name: &str,
    purpose: Purpose,
    value: &str,
    grace_ms: i64,
    now: i64,
) -> StoreResult<Rotation> {
    let Some(row) = db.query_opt(
        "SELECT id, origin = 'config' FROM subscription_secrets
          WHERE name = $1 AND purpose = $2 AND expires_at IS NULL FOR UPDATE",
        &[&name, &purpose.as_str()],
    )?
    else {
        return Ok(Rotation::NoSecret);
    };
    let (id, from_config): (i64, bool) = (row.try_get(0)?, row.try_get(1)?);
    if from_config {
        return Ok(Rotation::HeldByConfig);
    }
    let previous_until = now.saturating_add(grace_ms);
    db.execute(
        "UPDATE subscription_secrets SET expires_at = $2 WHERE id = $1",
        &[&id, &previous_until],
    )?;
    db.execute(
        "INSERT INTO subscription_secrets (name, purpose, value, created_at)
         VALUES ($1, $2, $3, $4)",
        &[&name, &purpose.as_str(), &value, &now],
    )?;
    crate::store::sql::registry::bump(db)?;
    Ok(Rotation::Rotated { previous_until })
}

/// The heartbeat's upkeep: secrets whose grace ended are gone. Returns how many.
pub(super) fn drop_expired(db: &mut Db<'_>, now: i64) -> StoreResult<usize> {
    let dropped = db.execute(
        "DELETE FROM subscription_secrets WHERE expires_at <= $1",
        &[&now],
    )?;
    Ok(usize::try_from(dropped).unwrap_or(0))
}
