//! Moving a whole database from one store to another (`webhook-inbox copy`), so that a user who
//! outgrows one SQLite file keeps everything: events with their status, attempts and history,
//! bodies, guard rows, balances, requests and documents.
//!
//! The stores agree on the tables and columns below; each store reads a table in key order in
//! pages ([`Store::copy_out`](super::Store::copy_out)) and writes rows as they are
//! ([`Store::copy_in`](super::Store::copy_in)). Values cross as [`Cell`]s: integers (booleans
//! included, as 0 and 1), text, bytes or null. A unit test of each store checks that these
//! lists are its whole schema, so that a migration adding a column cannot leave it behind.

use super::{Store, StoreError, StoreResult};

/// One value of a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cell {
    Null,
    Int(i64),
    Text(String),
    Bytes(Vec<u8>),
}

pub type Row = Vec<Cell>;

/// A table as the stores share it. `key` are the leading columns that identify a row, the
/// order of the copy and of its pages.
#[derive(Debug)]
pub struct Table {
    pub name: &'static str,
    pub columns: &'static [&'static str],
    pub key: usize,
}

impl Table {
    pub fn key_columns(&self) -> &'static [&'static str] {
        &self.columns[..self.key]
    }
}

/// Every table, parents before children (foreign keys hold at each step).
pub const TABLES: &[Table] = &[
    Table {
        name: "events",
        columns: &[
            "seq",
            "source",
            "event_id",
            "event_type",
            "status",
            "payload_sha256",
            "deliveries",
            "payload_mismatches",
            "received_at",
            "last_delivered_at",
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
            "lane",
            "finished_at",
            "purged_at",
        ],
        key: 1,
    },
    Table {
        name: "event_payloads",
        columns: &["seq", "payload", "content_type"],
        key: 1,
    },
    Table {
        name: "event_attempts",
        columns: &[
            "event_seq",
            "attempt",
            "worker",
            "started_at",
            "finished_at",
            "result",
            "error",
        ],
        key: 2,
    },
    Table {
        name: "processed_events",
        columns: &["consumer", "source", "event_id", "outcome", "processed_at"],
        key: 3,
    },
    Table {
        name: "loyalty_credits",
        columns: &[
            "order_id",
            "customer_id",
            "points",
            "source",
            "event_id",
            "credited_at",
        ],
        key: 1,
    },
    Table {
        name: "loyalty_balances",
        columns: &["customer_id", "balance"],
        key: 1,
    },
    Table {
        name: "requests",
        columns: &["id", "status", "created_at", "submitted_at"],
        key: 1,
    },
    Table {
        name: "request_documents",
        columns: &[
            "id",
            "request_id",
            "position",
            "name",
            "content_type",
            "content",
            "created_at",
        ],
        key: 1,
    },
];

/// Rows per page: one transaction on the target each.
pub const PAGE: usize = 1_000;

/// What a copy moved, per table.
#[derive(Debug, Default)]
pub struct CopyReport {
    pub tables: Vec<(&'static str, u64)>,
}

/// Tables of `to` that hold rows already (a copy refuses them unless told otherwise).
pub fn non_empty_tables(to: &dyn Store) -> StoreResult<Vec<&'static str>> {
    let mut found = Vec::new();
    for table in TABLES {
        if !to.copy_out(table, &[], 1)?.is_empty() {
            found.push(table.name);
        }
    }
    Ok(found)
}

/// Copy every table of `from` into `to`, page by page. Rows whose key `to` holds already are
/// skipped (so an interrupted copy can be run again with `allow_non_empty`). `progress` is
/// called after each page with the table, rows copied so far and the table's total.
pub fn copy_all(
    from: &dyn Store,
    to: &dyn Store,
    allow_non_empty: bool,
    progress: &mut dyn FnMut(&Table, u64, u64),
) -> anyhow::Result<CopyReport> {
    if !allow_non_empty {
        let found = non_empty_tables(to)?;
        if !found.is_empty() {
            anyhow::bail!(
                "the target database is not empty (rows in {}): copy into a new database, or \
                 pass --allow-non-empty to add to it (rows it holds already are skipped)",
                found.join(", ")
            );
        }
    }
    let mut report = CopyReport::default();
    for table in TABLES {
        let total = from.copy_count(table)?;
        let mut copied = 0u64;
        let mut after: Vec<Cell> = Vec::new();
        loop {
            let rows = from.copy_out(table, &after, PAGE)?;
            let Some(last) = rows.last() else { break };
            after = last[..table.key].to_vec();
            to.copy_in(table, &rows).map_err(|e| copy_error(table, e))?;
            copied += rows.len() as u64;
            progress(table, copied, total.max(copied));
            if rows.len() < PAGE {
                break;
            }
        }
        report.tables.push((table.name, copied));
    }
    to.copy_finished()?;
    Ok(report)
}

fn copy_error(table: &Table, e: StoreError) -> anyhow::Error {
    anyhow::anyhow!("copying table {}: {e}", table.name)
}
