//! Moving a whole database from one store to another (`webhook-inbox copy`), so that a user who
//! outgrows one SQLite file keeps everything: the registry of subscriptions with their secrets,
//! events with every subscription's state (ordering keys included), attempts and history,
//! bodies, guard rows, balances, requests, documents and the alerts' state.
//!
//! The stores agree on the tables and columns of [`TABLES`]; each store reads a table in key
//! order in pages ([`Store::copy_out`](super::Store::copy_out)) and writes rows as they are
//! ([`Store::copy_in`](super::Store::copy_in)). Values cross as [`Cell`]s: integers (booleans
//! included, as 0 and 1), text, bytes or null. A test of each store checks that these lists
//! are its whole schema, so that a migration adding a column cannot leave it behind.
//!
//! `listen` sessions (origin `session`) are copied as they are: on the target they are what a
//! session whose `listen` went away is, removed by the first node's heartbeat once idle for
//! `session_idle_seconds`, their unfinished states finished as `removed` with their history.

mod resume;
mod tables;

pub use resume::check_resumable;
pub use tables::TABLES;

use std::collections::{BTreeSet, HashMap};

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
/// order of the copy and of its pages. `seeded` are the keys (an integer first column) of the
/// rows every database's migrations make: the target's are replaced by the source's (or
/// deleted where the source has none), and do not make it "not empty".
#[derive(Debug)]
pub struct Table {
    pub name: &'static str,
    pub columns: &'static [&'static str],
    pub key: usize,
    pub seeded: &'static [i64],
}

impl Table {
    pub fn key_columns(&self) -> &'static [&'static str] {
        &self.columns[..self.key]
    }

    /// Whether `row` (or its key) is one the migrations make.
    pub fn is_seeded(&self, row: &[Cell]) -> bool {
        matches!(row.first(), Some(Cell::Int(k)) if self.seeded.contains(k))
    }

    /// The conflict clause of a copied row's `INSERT` (both dialects): a row present is
    /// skipped, but a seeded one is replaced whole.
    pub fn on_conflict(&self) -> String {
        if self.seeded.is_empty() {
            return "ON CONFLICT DO NOTHING".into();
        }
        let set: Vec<String> = self.columns[self.key..]
            .iter()
            .map(|c| format!("{c} = excluded.{c}"))
            .collect();
        let seeded: Vec<String> = self.seeded.iter().map(i64::to_string).collect();
        format!(
            "ON CONFLICT ({}) DO UPDATE SET {} WHERE {}.{} IN ({})",
            self.key_columns().join(", "),
            set.join(", "),
            self.name,
            self.columns[0],
            seeded.join(", ")
        )
    }
}

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
    /// The subscriptions whose secrets were copied sealed: the target's nodes need the
    /// source's `secrets_key` to read them (a node without it refuses to start).
    pub sealed: Vec<String>,
}

/// Tables of `to` that hold rows already, beside the seeded ones (a copy refuses them unless
/// told otherwise).
pub fn non_empty_tables(to: &dyn Store) -> StoreResult<Vec<&'static str>> {
    let mut found = Vec::new();
    for table in TABLES {
        // Past the seeded rows, if any: one more row than they are is one of another kind.
        let rows = to.copy_out(table, &[], table.seeded.len() + 1)?;
        if rows.iter().any(|r| !table.is_seeded(r)) {
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
    let mut sealed = BTreeSet::new();
    for table in TABLES {
        let total = from.copy_count(table)?;
        let (mut read, mut written) = (0u64, 0u64);
        let mut after: Vec<Cell> = Vec::new();
        let kept = held.get(table.name);
        for &key in table.seeded {
            // The first row after `key - 1` is `key`'s, if the source has one.
            let next = from.copy_out(table, &[Cell::Int(key - 1)], 1)?;
            if next.first().and_then(|r| r.first()) != Some(&Cell::Int(key)) {
                to.copy_forget(table, key)?;
            }
        }
        loop {
            let rows = from.copy_out(table, &after, PAGE)?;
            let Some(last) = rows.last() else { break };
            after = last[..table.key].to_vec();
            sealed.extend(sealed_names(table, &rows));
            let wrote = to.copy_in(table, &rows).map_err(|e| copy_error(table, e))?;
            // A row is skipped only where the target held that very row before the copy (a
            // seeded row is replaced, so written).
            let expected = rows
                .iter()
                .filter(|r| kept.is_some_and(|k| k.contains(&resume::key_digest(table, r))))
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
    // The source's fan-out cursor: the events after it get their states on the target by its
    // registry (the source's), as they would have on the source.
    to.copy_finished(from.fan_out_cursor()?)?;
    to.mark_copy(None)?;
    report.sealed = sealed.into_iter().collect();
    Ok(report)
}

/// The subscriptions named by rows of `subscription_secrets` whose value is sealed.
fn sealed_names(table: &Table, rows: &[Row]) -> Vec<String> {
    let at = |name: &str| table.columns.iter().position(|c| *c == name);
    let (true, Some(name), Some(value)) = (
        table.name == "subscription_secrets",
        at("name"),
        at("value"),
    ) else {
        return Vec::new();
    };
    rows.iter()
        .filter_map(|r| match (&r[name], &r[value]) {
            (Cell::Text(n), Cell::Text(v)) if crate::store::secrets::is_sealed(v) => {
                Some(n.clone())
            }
            _ => None,
        })
        .collect()
}

fn copy_error(table: &Table, e: StoreError) -> anyhow::Error {
    anyhow::anyhow!("copying table {}: {e}", table.name)
}
