//! `copy_in` of [`crate::store::copy`] on PostgreSQL, and what a copy rebuilds after it (its
//! reads are `store::sql::copy`'s). Cells are typed by the column: `bigint` and `boolean` (0
//! and 1, as SQLite stores it) cross as integers, `text` as text, `bytea` as bytes.

use postgres::types::{ToSql, Type};

use super::session::Db;
use crate::store::copy::{Cell, Row, Table};
use crate::store::{StoreError, StoreResult};

/// A cell as a parameter of the column's type (`ty`, from the prepared statement).
fn value(cell: &Cell, ty: &Type) -> StoreResult<Box<dyn ToSql + Sync>> {
    let mismatch = || {
        StoreError::Internal(anyhow::anyhow!(
            "a copied value {cell:?} does not fit a column of type {ty}"
        ))
    };
    Ok(match (cell, ty) {
        (Cell::Null, &Type::INT8) => Box::new(None::<i64>),
        (Cell::Null, &Type::BOOL) => Box::new(None::<bool>),
        (Cell::Null, &Type::BYTEA) => Box::new(None::<Vec<u8>>),
        (Cell::Null, _) => Box::new(None::<String>),
        (Cell::Int(i), &Type::INT8) => Box::new(*i),
        (Cell::Int(i), &Type::BOOL) => Box::new(*i != 0),
        (Cell::Text(t), &Type::TEXT) => Box::new(t.clone()),
        (Cell::Bytes(b), &Type::BYTEA) => Box::new(b.clone()),
        // SQLite is loosely typed: text in a bytea column is its bytes.
        (Cell::Text(t), &Type::BYTEA) => Box::new(t.as_bytes().to_vec()),
        _ => return Err(mismatch()),
    })
}

/// Insert rows as they are; a row whose key (or any unique column) is present is skipped,
/// but a seeded one ([`Table::seeded`]) is replaced.
pub(super) fn insert(db: &mut Db<'_>, table: &Table, rows: &[Row]) -> StoreResult<u64> {
    let marks: Vec<String> = (1..=table.columns.len()).map(|i| format!("${i}")).collect();
    // A secret's id is generated always (migration 0009): the copy keeps the source's.
    let overriding = if table.name == "subscription_secrets" {
        "OVERRIDING SYSTEM VALUE"
    } else {
        ""
    };
    let sql = format!(
        "INSERT INTO {} ({}) {overriding} VALUES ({}) {}",
        table.name,
        table.columns.join(", "),
        marks.join(", "),
        table.on_conflict()
    );
    let types = db.param_types(&sql)?;
    let mut written = 0;
    for row in rows {
        let values = row
            .iter()
            .zip(&types)
            .map(|(cell, ty)| value(cell, ty))
            .collect::<StoreResult<Vec<_>>>()?;
        let params: Vec<&(dyn ToSql + Sync)> = values.iter().map(|v| v.as_ref()).collect();
        written += db.execute(&sql, &params)?;
    }
    Ok(written)
}

pub(super) fn forget(db: &mut Db<'_>, table: &Table, key: i64) -> StoreResult<()> {
    if table.seeded.contains(&key) {
        db.execute(
            &format!("DELETE FROM {} WHERE {} = $1", table.name, table.columns[0]),
            &[&key],
        )?;
    }
    Ok(())
}

/// After a copy: the source's fan-out cursor (the copied lane-0 events up to it have their
/// states, those after it are fanned out by the target's first claim); new rows get keys after
/// every copied one (events, rejections, subscriptions, secrets, notices); the registry's
/// version moved on.
pub(super) fn finished(db: &mut Db<'_>, cursor: i64) -> StoreResult<()> {
    db.execute("UPDATE queue_cursor SET after_seq = $1", &[&cursor])?;
    for (table, column) in [
        ("event_log", "seq"),
        ("rejections", "id"),
        ("subscriptions", "id"),
        ("subscription_secrets", "id"),
        ("alert_notices", "id"),
    ] {
        db.batch(&format!(
            "SELECT setval(pg_get_serial_sequence('{table}', '{column}'),
                           greatest((SELECT max({column}) FROM {table}), 1),
                           (SELECT max({column}) FROM {table}) IS NOT NULL)"
        ))?;
    }
    crate::store::sql::registry::bump(db)
}
