//! Moving a whole database from one store to another (`webhook-inbox copy`), so that a user who
//! outgrows one SQLite file keeps everything: events with their status, attempts and history,
//! bodies, guard rows, balances, requests and documents.
//!
//! The stores agree on the tables and columns below; each store reads a table in key order in
//! pages ([`Store::copy_out`](super::Store::copy_out)) and writes rows as they are
//! ([`Store::copy_in`](super::Store::copy_in)). Values cross as [`Cell`]s: integers (booleans
//! included, as 0 and 1), text, bytes or null. A unit test of each store checks that these
//! lists are its whole schema, so that a migration adding a column cannot leave it behind.

use std::collections::{HashMap, HashSet};

use super::{Holder, Store, StoreError, StoreResult};

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
        columns: &["seq", "payload", "content_type", "traceparent"],
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
        name: "rejections",
        columns: &[
            "id",
            "received_at",
            "source",
            "peer",
            "reason",
            "status",
            "message",
            "headers",
            "body_bytes",
            "body_sha256",
        ],
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

/// What a copy did with one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableReport {
    pub name: &'static str,
    /// Rows of the source.
    pub read: u64,
    /// Rows written into the target.
    pub written: u64,
}

impl TableReport {
    /// Rows the target held already, each the source's own row (an interrupted copy's).
    pub fn skipped(&self) -> u64 {
        self.read - self.written
    }
}

/// What a copy did, per table.
#[derive(Debug, Default)]
pub struct CopyReport {
    pub tables: Vec<TableReport>,
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

/// Copy every table of `from` into `to`, page by page, holding `to` alone (no node may serve
/// it meanwhile: see [`Store::hold`]). A target that holds rows is refused unless
/// `allow_non_empty`, and then only if every row it holds is `from`'s own row of the same key,
/// as an interrupted copy of `from` left it ([`check_resumable`]): those are skipped, and the
/// rest written. `progress` is called after each page with the table, rows read so far and the
/// table's total.
pub fn copy_all(
    from: &dyn Store,
    to: &dyn Store,
    allow_non_empty: bool,
    progress: &mut dyn FnMut(&Table, u64, u64),
) -> anyhow::Result<CopyReport> {
    // Held before anything is written, migrations included: no node migrates or serves it
    // meanwhile.
    let _alone = to.hold(Holder::Copy)?.ok_or_else(|| {
        anyhow::anyhow!(
            "the target database is in use by a running webhook-inbox node (or another copy): \
             stop every node that serves it first. A copy beside live nodes would race their \
             ingest and claims for the same keys"
        )
    })?;
    to.migrate()?;
    // The tables below hold one state per event: what the implicit subscriptions keep (their
    // routes do not overlap). A database whose events fan out to others would lose states.
    let implicit = crate::subscriptions::implicit(&crate::config::Settings::default());
    if let Some(other) = from.subscriptions(false)?.iter().find(|s| {
        !implicit
            .iter()
            .any(|i| i.name == s.name && i.kind.as_str() == s.kind && i.route == s.route)
    }) {
        anyhow::bail!(
            "the source database has subscription `{}`, which is not one of the implicit ones \
             as built in: a copy keeps one state per event in this version, so it copies only \
             databases served by the implicit subscriptions (loyalty, downstream, audit)",
            other.name
        );
    }
    let found = non_empty_tables(to)?;
    let held = if found.is_empty() {
        HashMap::new()
    } else {
        if !allow_non_empty {
            anyhow::bail!(
                "the target database is not empty (rows in {}): copy into a new database, or \
                 pass --allow-non-empty to resume an interrupted copy of the same source",
                found.join(", ")
            );
        }
        check_resumable(from, to)?
    };
    // Until the last table is in, a node refuses this database, also after this process dies.
    to.mark_copy(Some(crate::domain::time::now_ms()))?;
    let mut report = CopyReport::default();
    for table in TABLES {
        let total = from.copy_count(table)?;
        let (mut read, mut written) = (0u64, 0u64);
        let mut after: Vec<Cell> = Vec::new();
        let kept = held.get(table.name);
        loop {
            let rows = from.copy_out(table, &after, PAGE)?;
            let Some(last) = rows.last() else { break };
            after = last[..table.key].to_vec();
            let wrote = to.copy_in(table, &rows).map_err(|e| copy_error(table, e))?;
            // A row is skipped only where the target held that very row before the copy.
            let expected = rows
                .iter()
                .filter(|r| kept.is_some_and(|k| k.contains(&digest(&r[..table.key]))))
                .count() as u64;
            if wrote + expected != rows.len() as u64 {
                anyhow::bail!(
                    "copying table {}: of a page of {} rows, {wrote} were written and {expected} \
                     were there before the copy; the rest were not written: something else \
                     writes to the target. Nothing is lost from the source; stop what writes \
                     there and run the copy again with --allow-non-empty",
                    table.name,
                    rows.len()
                );
            }
            written += wrote;
            read += rows.len() as u64;
            progress(table, read, total.max(read));
            if rows.len() < PAGE {
                break;
            }
        }
        report.tables.push(TableReport {
            name: table.name,
            read,
            written,
        });
    }
    // The subscriptions' rules as the source's registry holds them (the implicit three, by
    // the check above): a node's config applies its own again when it starts.
    let rules: Vec<crate::subscriptions::Subscription> = from
        .registry()?
        .into_iter()
        .filter_map(|live| {
            let mut sub = implicit.iter().find(|i| i.name == live.name)?.clone();
            sub.mode = live.rules.mode;
            sub.max_attempts = live.rules.max_attempts;
            sub.backoff_base_ms = live.rules.backoff_base_ms;
            sub.backoff_max_ms = live.rules.backoff_max_ms;
            Some(sub)
        })
        .collect();
    to.sync_subscriptions(&rules, crate::domain::time::now_ms())?;
    to.copy_finished()?;
    to.mark_copy(None)?;
    Ok(report)
}

/// A cell as both stores compare it: SQLite may keep text where PostgreSQL keeps bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Plain {
    Null,
    Int(i64),
    Bytes(Vec<u8>),
}

fn plain(cells: &[Cell]) -> Vec<Plain> {
    cells
        .iter()
        .map(|c| match c {
            Cell::Null => Plain::Null,
            Cell::Int(i) => Plain::Int(*i),
            Cell::Text(t) => Plain::Bytes(t.as_bytes().to_vec()),
            Cell::Bytes(b) => Plain::Bytes(b.clone()),
        })
        .collect()
}

fn digest(row: &[Cell]) -> [u8; 32] {
    digest_plain(&plain(row))
}

fn digest_plain(row: &[Plain]) -> [u8; 32] {
    use sha2::{Digest as _, Sha256};
    let mut hash = Sha256::new();
    for cell in row {
        match cell {
            Plain::Null => hash.update([0]),
            Plain::Int(i) => {
                hash.update([1]);
                hash.update(i.to_le_bytes());
            }
            Plain::Bytes(b) => {
                hash.update([2]);
                hash.update((b.len() as u64).to_le_bytes());
                hash.update(b);
            }
        }
    }
    hash.finalize().into()
}

/// Every row of `table` in `store`, page by page, in the store's key order.
fn each_row(
    store: &dyn Store,
    table: &Table,
    mut f: impl FnMut(&Row) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut after: Vec<Cell> = Vec::new();
    loop {
        let rows = store.copy_out(table, &after, PAGE)?;
        for row in &rows {
            f(row)?;
        }
        match rows.last() {
            Some(last) if rows.len() == PAGE => after = last[..table.key].to_vec(),
            _ => return Ok(()),
        }
    }
}

/// Whether adding `from` to `to` can only resume a copy: every row `to` holds must be `from`'s
/// row of the same key, cell for cell. Any other row (another database's event under the same
/// `seq`, a customer's balance from elsewhere, a node's own ingest, a source changed since the
/// interrupted copy) would make the copy skip the source's row as "already there" and lose it,
/// or attach history and bodies to the wrong event: refused, naming the first such row. The
/// target's rows are held as key and digest, so this costs a read of both, not their bodies
/// in memory.
///
/// Returns the digests of the keys the target holds, per table: the rows the copy may skip.
pub fn check_resumable(
    from: &dyn Store,
    to: &dyn Store,
) -> anyhow::Result<HashMap<&'static str, HashSet<[u8; 32]>>> {
    let mut kept = HashMap::new();
    let refuse = |table: &Table, key: &[Plain], why: &str| {
        anyhow::anyhow!(
            "the target database holds data that is not this source's: {} row {} {why}. \
             --allow-non-empty only resumes an interrupted copy of the same, unchanged \
             source; copy into a new database",
            table.name,
            describe(key)
        )
    };
    for table in TABLES {
        let mut held: HashMap<Vec<Plain>, [u8; 32]> = HashMap::new();
        each_row(to, table, |row| {
            held.insert(plain(&row[..table.key]), digest(row));
            Ok(())
        })?;
        if held.is_empty() {
            continue;
        }
        kept.insert(
            table.name,
            held.keys()
                .map(|key| digest_plain(key))
                .collect::<HashSet<_>>(),
        );
        each_row(from, table, |row| {
            let key = plain(&row[..table.key]);
            match held.remove(&key) {
                Some(theirs) if theirs != digest(row) => Err(refuse(
                    table,
                    &key,
                    "differs from the source's row of that key",
                )),
                _ => Ok(()),
            }
        })?;
        // The first such key in order, so that the message is the same at every run.
        if let Some(key) = held.keys().min_by_key(|k| describe(k)) {
            return Err(refuse(table, key, "is not in the source"));
        }
    }
    Ok(kept)
}

fn describe(key: &[Plain]) -> String {
    let parts: Vec<String> = key
        .iter()
        .map(|k| match k {
            Plain::Null => "null".into(),
            Plain::Int(i) => i.to_string(),
            Plain::Bytes(b) => format!("{:?}", String::from_utf8_lossy(b)),
        })
        .collect();
    format!("({})", parts.join(", "))
}

fn copy_error(table: &Table, e: StoreError) -> anyhow::Error {
    anyhow::anyhow!("copying table {}: {e}", table.name)
}
