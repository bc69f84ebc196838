//! `copy_out` and `copy_in` of [`crate::store::copy`] on PostgreSQL. Cells are typed by the
//! column: `bigint` and `boolean` (0 and 1, as SQLite stores it) cross as integers, `text` as
//! text, `bytea` as bytes.

use postgres::types::{ToSql, Type};

use super::session::Db;
use crate::store::copy::{Cell, Row, Table};
use crate::store::{StoreError, StoreResult};

fn cell(row: &postgres::Row, i: usize) -> StoreResult<Cell> {
    let ty = row.columns()[i].type_().clone();
    Ok(match ty {
        Type::INT8 => row
            .try_get::<_, Option<i64>>(i)?
            .map_or(Cell::Null, Cell::Int),
        Type::INT4 => row
            .try_get::<_, Option<i32>>(i)?
            .map_or(Cell::Null, |v| Cell::Int(v.into())),
        Type::BOOL => row
            .try_get::<_, Option<bool>>(i)?
            .map_or(Cell::Null, |v| Cell::Int(v.into())),
        Type::BYTEA => row
            .try_get::<_, Option<Vec<u8>>>(i)?
            .map_or(Cell::Null, Cell::Bytes),
        Type::TEXT => row
            .try_get::<_, Option<String>>(i)?
            .map_or(Cell::Null, Cell::Text),
        other => {
            return Err(StoreError::Internal(anyhow::anyhow!(
                "column {} has type {other}, which the copy does not carry",
                row.columns()[i].name()
            )));
        }
    })
}

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

/// Up to `limit` rows after the key `after` (empty: from the first), in key order.
pub(super) fn rows(
    db: &mut Db<'_>,
    table: &Table,
    after: &[Cell],
    limit: usize,
) -> StoreResult<Vec<Row>> {
    let key = table.key_columns().join(", ");
    let from = if after.is_empty() {
        String::new()
    } else {
        let marks: Vec<String> = (1..=after.len()).map(|i| format!("${i}")).collect();
        format!("WHERE ({key}) > ({})", marks.join(", "))
    };
    // The key's values are typed like the table's own columns (SQLite's key types are text
    // and integer only).
    let after_values: Vec<Box<dyn ToSql + Sync>> = after
        .iter()
        .map(|c| -> Box<dyn ToSql + Sync> {
            match c {
                Cell::Int(i) => Box::new(*i),
                Cell::Text(t) => Box::new(t.clone()),
                Cell::Bytes(b) => Box::new(b.clone()),
                Cell::Null => Box::new(None::<String>),
            }
        })
        .collect();
    let params: Vec<&(dyn ToSql + Sync)> = after_values.iter().map(|v| v.as_ref()).collect();
    let sql = format!(
        "SELECT {} FROM {} {from} ORDER BY {key} LIMIT {limit}",
        table.columns.join(", "),
        table.name
    );
    db.query(&sql, &params)?
        .iter()
        .map(|r| (0..table.columns.len()).map(|i| cell(r, i)).collect())
        .collect()
}

pub(super) fn count(db: &mut Db<'_>, table: &Table) -> StoreResult<u64> {
    let n: i64 = db
        .query_one(&format!("SELECT count(*) FROM {}", table.name), &[])?
        .try_get(0)?;
    Ok(n as u64)
}

/// Insert rows as they are; a row whose key (or any unique column) is present is skipped.
///
/// `events` is a view here (migration 0003): an event goes into the log, and its one state
/// (the implicit subscription that handled it, as the source keeps it) into `event_state`; an
/// attempt goes to that state. The fan-out cursor then moves past every copied event.
pub(super) fn insert(db: &mut Db<'_>, table: &Table, rows: &[Row]) -> StoreResult<u64> {
    match table.name {
        "events" => insert_events(db, table, rows),
        "event_attempts" => {
            // An attempt goes to its event's one state.
            let marks: Vec<String> = (1..=table.columns.len()).map(|i| format!("${i}")).collect();
            let sql = format!(
                "INSERT INTO event_attempts ({}, sub)
                 SELECT {}, (SELECT min(sub) FROM event_state WHERE seq = $1::bigint)
                 ON CONFLICT DO NOTHING",
                table.columns.join(", "),
                marks.join(", ")
            );
            let all: Vec<Option<&str>> = table.columns.iter().map(|c| Some(*c)).collect();
            insert_projected(db, &sql, table, rows, &all)
        }
        _ => {
            let sql = insert_sql(table.name, table.columns);
            let all: Vec<Option<&str>> = table.columns.iter().map(|c| Some(*c)).collect();
            insert_projected(db, &sql, table, rows, &all)
        }
    }
}

fn insert_sql(into: &str, columns: &[&str]) -> String {
    let marks: Vec<String> = (1..=columns.len()).map(|i| format!("${i}")).collect();
    format!(
        "INSERT INTO {into} ({}) VALUES ({}) ON CONFLICT DO NOTHING",
        columns.join(", "),
        marks.join(", ")
    )
}

/// Run `sql` for each row, its parameters the row's cells named by `columns` (`None`: a null).
fn insert_projected(
    db: &mut Db<'_>,
    sql: &str,
    table: &Table,
    rows: &[Row],
    columns: &[Option<&str>],
) -> StoreResult<u64> {
    let types = db.param_types(sql)?;
    let at: Vec<Option<usize>> = columns
        .iter()
        .map(|c| c.and_then(|c| table.columns.iter().position(|t| *t == c)))
        .collect();
    let mut written = 0;
    for row in rows {
        let values = at
            .iter()
            .zip(&types)
            .map(|(i, ty)| value(i.map_or(&Cell::Null, |i| &row[i]), ty))
            .collect::<StoreResult<Vec<_>>>()?;
        let params: Vec<&(dyn ToSql + Sync)> = values.iter().map(|v| v.as_ref()).collect();
        written += db.execute(sql, &params)?;
    }
    Ok(written)
}

const LOG_COLUMNS: [&str; 10] = [
    "seq",
    "source",
    "event_id",
    "event_type",
    "payload_sha256",
    "deliveries",
    "payload_mismatches",
    "received_at",
    "last_delivered_at",
    "lane",
];

const STATE_COLUMNS: [&str; 15] = [
    "seq",
    "lane",
    "status",
    "attempts",
    "budget_floor",
    "next_attempt_at",
    "claimed_until",
    "claimed_by",
    "claim_token",
    "completed_at",
    "outcome",
    "last_error",
    "abandoned",
    "finished_at",
    "purged_at",
];

fn insert_events(db: &mut Db<'_>, table: &Table, rows: &[Row]) -> StoreResult<u64> {
    let log_sql = insert_sql("event_log", &LOG_COLUMNS);
    let log: Vec<Option<&str>> = LOG_COLUMNS.iter().map(|c| Some(*c)).collect();
    let written = insert_projected(db, &log_sql, table, rows, &log)?;
    // The one state of each copied event: the implicit subscription that handled it (an event
    // stored with no state, `stored`, has none).
    let state_sql = format!(
        "INSERT INTO event_state ({}, sub)
         SELECT {}, CASE WHEN $2::bigint = 1 THEN 2
                         WHEN l.event_type = 'order.completed' THEN 1 ELSE 3 END
           FROM event_log l WHERE l.seq = $1::bigint AND $3::text <> 'stored'
         ON CONFLICT DO NOTHING",
        STATE_COLUMNS.join(", "),
        (1..=STATE_COLUMNS.len())
            .map(|i| format!("${i}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let state: Vec<Option<&str>> = STATE_COLUMNS.iter().map(|c| Some(*c)).collect();
    insert_projected(db, &state_sql, table, rows, &state)?;
    db.execute(
        "UPDATE queue_cursor SET after_seq = (SELECT coalesce(max(seq), 0) FROM event_log)",
        &[],
    )?;
    Ok(written)
}

/// After a copy: new events get a `seq`, and new rejections an `id`, after every copied one.
pub(super) fn finished(db: &mut Db<'_>) -> StoreResult<()> {
    db.batch(
        "SELECT setval(pg_get_serial_sequence('event_log', 'seq'),
                       greatest((SELECT max(seq) FROM event_log), 1),
                       (SELECT max(seq) FROM event_log) IS NOT NULL);
         SELECT setval(pg_get_serial_sequence('rejections', 'id'),
                       greatest((SELECT max(id) FROM rejections), 1),
                       (SELECT max(id) FROM rejections) IS NOT NULL)",
    )
}

/// Mark a copy into this database as started, or clear the mark.
pub(super) fn mark(db: &mut Db<'_>, started_at: Option<i64>) -> StoreResult<()> {
    match started_at {
        Some(at) => db.execute(
            "INSERT INTO copy_in_progress (id, started_at) VALUES (1, $1)
             ON CONFLICT (id) DO UPDATE SET started_at = excluded.started_at",
            &[&at],
        )?,
        None => db.execute("DELETE FROM copy_in_progress", &[])?,
    };
    Ok(())
}

pub(super) fn unfinished(db: &mut Db<'_>) -> StoreResult<Option<i64>> {
    Ok(db
        .query_opt("SELECT started_at FROM copy_in_progress", &[])?
        .map(|r| r.try_get(0))
        .transpose()?)
}
