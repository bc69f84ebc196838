//! Subscriptions' secrets on SQLite (see `store::secrets`): the current one of each purpose,
//! older ones in a rotation's grace, and the upkeep that drops them after it.

use rusqlite::{Connection, OptionalExtension, Transaction, params};

use crate::store::StoreResult;
use crate::store::secrets::{self, COLUMNS, Purpose, Rotation, StoredSecret};

fn read(r: &rusqlite::Row<'_>) -> rusqlite::Result<Option<StoredSecret>> {
    Ok(secrets::stored(
        &r.get::<_, String>(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
    ))
}

/// Every secret of `name` valid at `now`: current ones first, then the newest.
pub(super) fn list(conn: &Connection, name: &str, now: i64) -> StoreResult<Vec<StoredSecret>> {
    let rows = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM subscription_secrets
              WHERE name = ?1 AND (expires_at IS NULL OR expires_at > ?2)
              ORDER BY expires_at IS NOT NULL, created_at DESC, id DESC"
        ))?
        .query_map(params![name, now], read)?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows.into_iter().flatten().collect())
}

fn current(tx: &Transaction<'_>, name: &str, purpose: Purpose) -> StoreResult<Option<(i64, bool)>> {
    Ok(tx
        .query_row(
            "SELECT id, origin = 'config' FROM subscription_secrets
              WHERE name = ?1 AND purpose = ?2 AND expires_at IS NULL",
            params![name, purpose.as_str()],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?)
}

/// `value` becomes the current secret unless there is one; the current one either way.
pub(super) fn keep(
    tx: &Transaction<'_>,
    name: &str,
    purpose: Purpose,
    value: &str,
    now: i64,
) -> StoreResult<StoredSecret> {
    let added = tx.execute(
        "INSERT INTO subscription_secrets (name, purpose, value, created_at)
         VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (name, purpose) WHERE expires_at IS NULL DO NOTHING",
        params![name, purpose.as_str(), value, now],
    )?;
    if added > 0 {
        crate::store::sql::registry::bump(&mut super::dialect::Sqlite(tx))?;
    }
    let kept = tx.query_row(
        &format!(
            "SELECT {COLUMNS} FROM subscription_secrets
              WHERE name = ?1 AND purpose = ?2 AND expires_at IS NULL"
        ),
        params![name, purpose.as_str()],
        read,
    )?;
    kept.ok_or_else(|| anyhow::anyhow!("a kept secret of an unknown purpose").into())
}

/// A node's config gives `values`: they replace every kept secret of that purpose, the first
/// current, the others valid for as long as a config lists them.
pub(super) fn put_config(
    tx: &Transaction<'_>,
    name: &str,
    purpose: Purpose,
    values: &[String],
    now: i64,
) -> StoreResult<()> {
    tx.execute(
        "DELETE FROM subscription_secrets WHERE name = ?1 AND purpose = ?2",
        params![name, purpose.as_str()],
    )?;
    let mut add = tx.prepare(
        "INSERT INTO subscription_secrets (name, purpose, value, origin, created_at, expires_at)
         VALUES (?1, ?2, ?3, 'config', ?4, ?5)",
    )?;
    for (i, value) in values.iter().enumerate() {
        let expires = (i > 0).then_some(i64::MAX);
        add.execute(params![name, purpose.as_str(), value, now, expires])?;
    }
    crate::store::sql::registry::bump(&mut super::dialect::Sqlite(tx))
}

/// `value` becomes current; the one before stays valid for `grace_ms` (see `Store::rotate_secret`).
pub(super) fn rotate(
    tx: &Transaction<'_>,
    name: &str,
    purpose: Purpose,
    value: &str,
    grace_ms: i64,
    now: i64,
) -> StoreResult<Rotation> {
    let Some((id, from_config)) = current(tx, name, purpose)? else {
        return Ok(Rotation::NoSecret);
    };
    if from_config {
        return Ok(Rotation::HeldByConfig);
    }
    let previous_until = now.saturating_add(grace_ms);
    tx.execute(
        "UPDATE subscription_secrets SET expires_at = ?2 WHERE id = ?1",
        params![id, previous_until],
    )?;
    tx.execute(
        "INSERT INTO subscription_secrets (name, purpose, value, created_at)
         VALUES (?1, ?2, ?3, ?4)",
        params![name, purpose.as_str(), value, now],
    )?;
    crate::store::sql::registry::bump(&mut super::dialect::Sqlite(tx))?;
    Ok(Rotation::Rotated { previous_until })
}

/// The heartbeat's upkeep: secrets whose grace ended are gone. Returns how many.
pub(super) fn drop_expired(tx: &Transaction<'_>, now: i64) -> StoreResult<usize> {
    Ok(tx.execute(
        "DELETE FROM subscription_secrets WHERE expires_at <= ?1",
        [now],
    )?)
}

/// Migration 0016's second half: pull tokens kept plain become their digests, each with the
/// claims key that earlier versions derived from it (see `secrets::claims_key_of`).
pub(super) fn digest_plain_tokens(tx: &Transaction<'_>) -> StoreResult<()> {
    let plain: Vec<(i64, String, String, i64)> = tx
        .prepare(
            "SELECT id, name, value, created_at FROM subscription_secrets
              WHERE purpose = 'token' AND value NOT LIKE 'sha256:%'",
        )?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
        .collect::<Result<_, _>>()?;
    for (id, name, token, created_at) in plain {
        tx.execute(
            "UPDATE subscription_secrets SET value = ?2 WHERE id = ?1",
            params![id, secrets::token_digest(&token)],
        )?;
        tx.execute(
            "INSERT INTO subscription_secrets (name, purpose, value, created_at)
             VALUES (?1, 'claims', ?2, ?3)",
            params![
                name,
                hex::encode(secrets::claims_key_of(&token)),
                created_at
            ],
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use rusqlite::Connection;

    use super::super::migrations::{MIGRATIONS, apply_all};
    use crate::store::secrets::{claims_key_of, token_digest};

    /// A database whose pull token was kept plain (migration 0014): after 0016 the file holds
    /// only its digest, and the claims key earlier versions derived from it. Seen failing
    /// with the Rust half of the migration left out: the plain token stayed.
    #[test]
    fn a_plain_token_becomes_its_digest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.db");
        let mut conn = Connection::open(&path).unwrap();
        conn.execute_batch("PRAGMA foreign_keys = OFF").unwrap();
        let before = MIGRATIONS.iter().position(|m| m.0 == 16).unwrap();
        apply_all(&mut conn, &MIGRATIONS[..before]).unwrap();
        conn.execute_batch(
            "INSERT INTO subscription_secrets (name, purpose, value, created_at)
             VALUES ('worker', 'token', 'plain-token-0123456789', 5),
                    ('billing', 'signing', 'whsec_c2VjcmV0', 6)",
        )
        .unwrap();
        apply_all(&mut conn, MIGRATIONS).unwrap();
        let rows: Vec<(String, String, String, Option<i64>)> = conn
            .prepare(
                "SELECT name, purpose, value, expires_at FROM subscription_secrets
                  ORDER BY name, purpose",
            )
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let expected = vec![
            (
                "billing".into(),
                "signing".into(),
                "whsec_c2VjcmV0".into(),
                None,
            ),
            (
                "worker".into(),
                "claims".into(),
                hex::encode(claims_key_of("plain-token-0123456789")),
                None,
            ),
            (
                "worker".into(),
                "token".into(),
                token_digest("plain-token-0123456789"),
                None,
            ),
        ];
        assert_eq!(rows, expected);
        drop(conn);
        let file = std::fs::read(&path).unwrap();
        let wal = std::fs::read(dir.path().join("m.db-wal")).unwrap_or_default();
        for bytes in [file, wal] {
            assert!(
                !bytes
                    .windows(b"plain-token-0123456789".len())
                    .any(|w| w == b"plain-token-0123456789"),
                "the plain token is still in the file"
            );
        }
    }
}
