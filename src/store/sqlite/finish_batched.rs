//! The finish's two per-event statements run once for many events: the fenced `COMPLETE` of
//! the claims one claim statement made, and the closing of their attempts in the history.
//!
//! A statement executed once per event paid, besides its row's work, for binding six values,
//! opening a cursor on the table and each index it touches, and halting and resetting: about a
//! third of the 15,800 instructions of a `COMPLETE` at its row and of the 10,600 of closing an
//! attempt (docs/performance.md, "The drain's writer"). Here the batch's rows are bound as one
//! array (`rarray`), and the statement steps from row to row.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use rusqlite::params;
use rusqlite::types::Value;

use super::consume::Prepared;
use crate::store::{AttemptResult, ClaimRef, Outcome, StoreError, StoreResult};

/// [`super::consume::COMPLETE_AT_ROW`] for the rows `?1` (rowids the claims returned), all
/// claimed by one claim statement (token ?2) and completed with outcome ?4 at ?3: the same
/// fence (token, `claimed`, lease running), the same columns. It returns the rows it moved.
pub(super) const COMPLETE_ROWS: &str = "UPDATE event_state
    SET status = 'completed', completed_at = ?3, outcome = ?4, last_error = NULL,
        next_attempt_at = NULL, claim_token = NULL, claimed_until = NULL, claimed_by = NULL
  WHERE rowid IN rarray(?1) AND claim_token = ?2 AND status = 'claimed' AND claimed_until > ?3
RETURNING rowid, seq, sub";

/// Close the attempts `?3` (the events' `seq`) of subscription ?4, attempt ?5, with result ?2
/// at ?1 and no error: what `close_attempt` writes for each.
pub(super) const CLOSE_ATTEMPTS: &str = "UPDATE event_attempts
    SET finished_at = ?1, result = ?2, error = NULL
  WHERE event_seq IN rarray(?3) AND sub = ?4 AND attempt = ?5";

/// The completions in groups, each given as indices into `items`: those of one claim statement
/// (one token) that know their row and end with one outcome together, each of the others
/// alone. A fan-out's claims share their statement's token, so a drained batch is one group.
pub(super) fn by_claim(items: &[(&ClaimRef, Outcome)]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut open: HashMap<(&str, &str), usize> = HashMap::new();
    for (i, (claim, outcome)) in items.iter().enumerate() {
        if claim.row.is_none() {
            groups.push(vec![i]);
            continue;
        }
        let key = (claim.claim_token.as_str(), outcome.as_str());
        match open.get(&key) {
            Some(&g) => groups[g].push(i),
            None => {
                open.insert(key, groups.len());
                groups.push(vec![i]);
            }
        }
    }
    groups
}

/// [`COMPLETE_ROWS`] over `group` (indices into `items`, one token and outcome, each with its
/// row), setting `held` for each claim whose fence held.
///
/// The row alone does not name the claim: each moved row's `seq` and subscription must be its
/// claim's, as the per-row fence checks them. Rowids stay put while the server runs (only a
/// full `VACUUM` renumbers them, run with the server stopped), so a row moved under another
/// claim's rowid means the store is not what it claims to be: the error rolls the whole
/// transaction back, nothing is applied, and the leases run out as after a crash.
pub(super) fn complete(
    prepared: &mut Prepared<'_>,
    items: &[(&ClaimRef, Outcome)],
    group: &[usize],
    now: i64,
    held: &mut [bool],
) -> StoreResult<()> {
    let (first, outcome) = items[group[0]];
    let mut by_row = HashMap::with_capacity(group.len());
    let mut rows = Vec::with_capacity(group.len());
    for &i in group {
        let row = items[i].0.row.ok_or_else(|| internal("a grouped claim has no row"))?;
        by_row.insert(row, i);
        rows.push(Value::Integer(row));
    }
    let statement = prepared.get(COMPLETE_ROWS)?;
    let mut moved = statement.query(params![
        Rc::new(rows),
        first.claim_token,
        now,
        outcome.as_str()
    ])?;
    while let Some(r) = moved.next()? {
        let (row, seq, sub): (i64, i64, i64) = (r.get(0)?, r.get(1)?, r.get(2)?);
        match by_row.get(&row) {
            Some(&i) if items[i].0.seq == seq && items[i].0.subscription == sub => held[i] = true,
            _ => return Err(internal("a completed row is not its claim's")),
        }
    }
    Ok(())
}

/// The attempts to close in groups of indices into `items`: those of one subscription and
/// attempt number closing with one result and no error together, each of the others alone.
pub(super) fn by_attempt(items: &[(&ClaimRef, AttemptResult, Option<&str>)]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut open: HashMap<(i64, i64, &str), usize> = HashMap::new();
    for (i, (claim, result, error)) in items.iter().enumerate() {
        if error.is_some() {
            groups.push(vec![i]);
            continue;
        }
        let key = (claim.subscription, claim.attempt, result.as_str());
        match open.get(&key) {
            Some(&g) => groups[g].push(i),
            None => {
                open.insert(key, groups.len());
                groups.push(vec![i]);
            }
        }
    }
    groups
}

/// [`CLOSE_ATTEMPTS`] over `group` (indices into `items`: one subscription, attempt and result,
/// no error).
pub(super) fn close_attempts(
    prepared: &mut Prepared<'_>,
    items: &[(&ClaimRef, AttemptResult, Option<&str>)],
    group: &[usize],
    now: i64,
) -> StoreResult<()> {
    let (first, result, _) = items[group[0]];
    let seqs: Vec<Value> = group
        .iter()
        .map(|&i| Value::Integer(items[i].0.seq))
        .collect();
    prepared.get(CLOSE_ATTEMPTS)?.execute(params![
        now,
        result.as_str(),
        Rc::new(seqs),
        first.subscription,
        first.attempt
    ])?;
    Ok(())
}

/// Each event's dedup row for consumer ?1 of source ?2, events ?3 (ids), with outcome ?4 at
/// ?5, where none is yet: what the per-event insert writes. It returns the ids it inserted.
pub(super) const MARK_PROCESSED: &str =
    "INSERT INTO processed_events (consumer, source, event_id, outcome, processed_at)
SELECT ?1, ?2, value, ?4, ?5 FROM rarray(?3) WHERE true
    ON CONFLICT DO NOTHING
RETURNING event_id";

/// The dedup rows in groups of indices into `items`: those of one consumer and source
/// together, each of the others alone. An event met twice in a group is alone, after its
/// group, so that the first one inserts and the second finds it, as one insert each would.
pub(super) fn by_consumer(items: &[(&str, &ClaimRef)]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut open: HashMap<(&str, &str), (usize, HashSet<&str>)> = HashMap::new();
    for (i, (consumer, claim)) in items.iter().enumerate() {
        let key = (*consumer, claim.source.as_str());
        match open.get_mut(&key) {
            Some((g, ids)) => {
                if ids.insert(claim.event_id.as_str()) {
                    groups[*g].push(i);
                } else {
                    groups.push(vec![i]);
                }
            }
            None => {
                open.insert(key, (groups.len(), HashSet::from([claim.event_id.as_str()])));
                groups.push(vec![i]);
            }
        }
    }
    groups
}

/// [`MARK_PROCESSED`] over `group` (indices into `items`: one consumer and source, each event
/// once), setting `inserted` for each row it wrote.
pub(super) fn mark_processed(
    prepared: &mut Prepared<'_>,
    items: &[(&str, &ClaimRef)],
    group: &[usize],
    (outcome, now): (Outcome, i64),
    inserted: &mut [bool],
) -> StoreResult<()> {
    let (consumer, first) = items[group[0]];
    let ids: Vec<Value> = group
        .iter()
        .map(|&i| Value::Text(items[i].1.event_id.clone()))
        .collect();
    let statement = prepared.get(MARK_PROCESSED)?;
    let mut rows = statement.query(params![
        consumer,
        first.source,
        Rc::new(ids),
        outcome.as_str(),
        now
    ])?;
    let mut written = HashSet::with_capacity(group.len());
    while let Some(r) = rows.next()? {
        written.insert(r.get::<_, String>(0)?);
    }
    for &i in group {
        inserted[i] = written.contains(&items[i].1.event_id);
    }
    Ok(())
}

fn internal(what: &str) -> StoreError {
    StoreError::Internal(anyhow::anyhow!("{what}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store as _;
    use crate::store::sqlite::{SqliteOptions, SqliteStore};

    /// Both statements seek each of the batch's rows by its key (the state's rowid, the
    /// history's primary key): a batch costs its rows, never a scan of the tables that grow.
    #[test]
    fn each_batched_statement_seeks_its_rows_by_their_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inbox.db");
        SqliteStore::open(&path, SqliteOptions::default())
            .unwrap()
            .migrate()
            .unwrap();
        let conn = rusqlite::Connection::open(&path).unwrap();
        rusqlite::vtab::array::load_module(&conn).unwrap();
        let rows = Rc::new(vec![Value::Integer(1), Value::Integer(2)]);
        let plan = |sql: &str, values: &[&dyn rusqlite::ToSql]| -> Vec<String> {
            conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .unwrap()
                .query_map(values, |r| r.get(3))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap()
        };
        let complete = plan(COMPLETE_ROWS, params![rows, "t", 0, "credited"]);
        assert!(
            complete
                .iter()
                .any(|p| p.starts_with("SEARCH event_state USING INTEGER PRIMARY KEY (rowid=?)")),
            "{complete:?}"
        );
        let close = plan(CLOSE_ATTEMPTS, params![0, "ok", rows, 1, 1]);
        assert!(
            close.iter().any(|p| p.starts_with(
                "SEARCH event_attempts USING PRIMARY KEY (event_seq=? AND sub=? AND attempt=?)"
            )),
            "{close:?}"
        );
        for p in complete.iter().chain(&close) {
            assert!(!p.starts_with("SCAN event_"), "{complete:?} {close:?}");
        }
    }
}
