//! Whether a copy into a database that holds rows can only be resuming an interrupted copy of
//! the same source ([`check_resumable`]).

use std::collections::{HashMap, HashSet};

use super::{Cell, PAGE, Row, TABLES, Table};
use crate::store::Store;

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

/// The digest of `row`'s key, as [`check_resumable`] returns the keys the target holds.
pub(super) fn key_digest(table: &Table, row: &[Cell]) -> [u8; 32] {
    digest(&row[..table.key])
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
/// The target's seeded rows ([`Table::seeded`]) are left out: the copy replaces them.
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
            if !table.is_seeded(row) {
                held.insert(plain(&row[..table.key]), digest(row));
            }
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
            if table.is_seeded(row) {
                return Ok(());
            }
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
