//! Migration 0016's second half on SQLite: what SQL alone cannot do there, a SHA-256 (the
//! secrets themselves are read and written by `store::sql::secrets`).

use rusqlite::{Transaction, params};

use crate::store::StoreResult;
use crate::store::secrets;

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
