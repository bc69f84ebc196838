//! The alert state and the notice outbox on SQLite (see `store::alerts`). One writer at a
//! time (`BEGIN IMMEDIATE`) already orders two processes on one file; the conditional updates
//! keep the rule the same as on PostgreSQL, where they are what decides.

use rusqlite::{OptionalExtension, Transaction, params};

use super::SqliteStore;
use super::dialect::Sqlite;
use crate::store::alerts::{ActiveAlert, AlertStore, AlertSubject, Notice, Observation};
use crate::store::{StoreResult, sql};

const NOTICE: &str = "id, alert, episode, phase, channel, title, figure, since, link, \
                      created_at, attempts";

fn notice(r: &rusqlite::Row<'_>) -> rusqlite::Result<Notice> {
    Ok(Notice {
        id: r.get(0)?,
        alert: r.get(1)?,
        episode: r.get(2)?,
        phase: r.get(3)?,
        channel: r.get(4)?,
        title: r.get(5)?,
        figure: r.get(6)?,
        since: r.get(7)?,
        link: r.get(8)?,
        created_at: r.get(9)?,
        attempts: r.get(10)?,
    })
}

fn write_notice(
    tx: &Transaction<'_>,
    o: &Observation,
    episode: i64,
    phase: &str,
    since: i64,
    now: i64,
) -> StoreResult<Option<Notice>> {
    let sql = format!(
        "INSERT INTO alert_notices (alert, episode, phase, channel, title, figure, since, link,
                                    created_at, next_attempt_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9)
         ON CONFLICT (alert, episode, phase) DO NOTHING
         RETURNING {NOTICE}"
    );
    Ok(tx
        .prepare_cached(&sql)?
        .query_row(
            params![
                o.alert, episode, phase, o.channel, o.title, o.figure, since, o.link, now
            ],
            notice,
        )
        .optional()?)
}

fn observe_one(tx: &Transaction<'_>, o: &Observation, now: i64) -> StoreResult<Option<Notice>> {
    if o.holding {
        tx.prepare_cached(
            "INSERT INTO alert_state (alert, holding_since) VALUES (?1, ?2)
             ON CONFLICT (alert) DO UPDATE
                SET holding_since = coalesce(alert_state.holding_since, excluded.holding_since)",
        )?
        .execute(params![o.alert, now])?;
        let started: Option<(i64, i64)> = tx
            .prepare_cached(
                "UPDATE alert_state
                    SET active = 1, episode = episode + 1, started_at = holding_since, figure = ?3,
                        changed_at = ?4
                  WHERE alert = ?1 AND active = 0 AND holding_since <= ?2
                    AND (changed_at IS NULL OR changed_at < ?4)
                 RETURNING episode, started_at",
            )?
            .query_row(params![o.alert, now - o.for_ms, o.figure, now], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?;
        return match started {
            Some((episode, since)) => write_notice(tx, o, episode, "started", since, now),
            None => Ok(None),
        };
    }
    let cleared: Option<(i64, i64)> = tx
        .prepare_cached(
            "UPDATE alert_state SET active = 0, holding_since = NULL, changed_at = ?2
              WHERE alert = ?1 AND active = 1 AND (changed_at IS NULL OR changed_at < ?2)
             RETURNING episode, started_at",
        )?
        .query_row(params![o.alert, now], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    match cleared {
        Some((episode, since)) => write_notice(tx, o, episode, "cleared", since, now),
        None => {
            tx.prepare_cached(
                "UPDATE alert_state SET holding_since = NULL
                  WHERE alert = ?1 AND active = 0 AND holding_since <= ?2",
            )?
            .execute(params![o.alert, now])?;
            Ok(None)
        }
    }
}

/// Whether applying `observations` would change a row (read without the write lock): a
/// condition that starts to hold or has held long enough, or an open or holding one that no
/// longer holds.
fn would_change(
    c: &rusqlite::Connection,
    observations: &[Observation],
    now: i64,
) -> StoreResult<bool> {
    let mut stmt =
        c.prepare_cached("SELECT active, holding_since FROM alert_state WHERE alert = ?1")?;
    for o in observations {
        let row: Option<(bool, Option<i64>)> = stmt
            .query_row([&o.alert], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        let change = match (o.holding, row) {
            (true, None | Some((_, None))) => true,
            (true, Some((active, Some(since)))) => !active && since <= now - o.for_ms,
            (false, None) => false,
            (false, Some((active, since))) => active || since.is_some(),
        };
        if change {
            return Ok(true);
        }
    }
    Ok(false)
}

impl AlertStore for SqliteStore {
    fn observe(&self, observations: &[Observation], now: i64) -> StoreResult<Vec<Notice>> {
        // Most rounds change nothing: known on a read, without the write lock ingest needs.
        if !self.read(|c| would_change(c, observations, now))? {
            return Ok(Vec::new());
        }
        self.write(|tx| {
            let mut written = Vec::new();
            for o in observations {
                written.extend(observe_one(tx, o, now)?);
            }
            Ok(written)
        })
    }

    fn claim_notices(
        &self,
        channel: &str,
        claimer: &str,
        limit: usize,
        lease_ms: i64,
        max_attempts: i64,
        now: i64,
    ) -> StoreResult<Vec<Notice>> {
        let sql = format!(
            "UPDATE alert_notices
                SET claimed_by = ?2, claimed_until = ?3 + ?4, attempts = attempts + 1
              WHERE id IN (SELECT id FROM alert_notices n
                            WHERE channel = ?1 AND sent_at IS NULL AND next_attempt_at <= ?3
                              AND (claimed_until IS NULL OR claimed_until <= ?3)
                              AND attempts < ?5
                              -- In order within an alert: not while an earlier notice of it
                              -- (its started one) waits to be sent or retried.
                              AND NOT EXISTS (SELECT 1 FROM alert_notices e
                                               WHERE e.alert = n.alert AND e.id < n.id
                                                 AND e.sent_at IS NULL AND e.attempts < ?5)
                            ORDER BY id LIMIT ?6)
             RETURNING {NOTICE}"
        );
        // Due notices are looked for on a read: the write lock only when there is one.
        let due: bool = self.read(|c| {
            Ok(c.prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM alert_notices
                                 WHERE channel = ?1 AND sent_at IS NULL AND next_attempt_at <= ?2
                                   AND (claimed_until IS NULL OR claimed_until <= ?2)
                                   AND attempts < ?3)",
            )?
            .query_row(params![channel, now, max_attempts], |r| r.get(0))?)
        })?;
        if !due {
            return Ok(Vec::new());
        }
        self.write(|tx| {
            let mut stmt = tx.prepare_cached(&sql)?;
            let rows = stmt.query_map(
                params![channel, claimer, now, lease_ms, max_attempts, limit as i64],
                notice,
            )?;
            let mut claimed = rows.collect::<Result<Vec<_>, _>>()?;
            claimed.sort_by_key(|n| n.id);
            Ok(claimed)
        })
    }

    fn notice_sent(&self, id: i64, claimer: &str, now: i64) -> StoreResult<bool> {
        self.write(|tx| {
            Ok(tx
                .prepare_cached(
                    "UPDATE alert_notices
                        SET sent_at = ?3, claimed_by = NULL, claimed_until = NULL
                      WHERE id = ?1 AND claimed_by = ?2 AND sent_at IS NULL",
                )?
                .execute(params![id, claimer, now])?
                == 1)
        })
    }

    fn notice_failed(
        &self,
        id: i64,
        claimer: &str,
        error: &str,
        retry_at: i64,
    ) -> StoreResult<bool> {
        self.write(|tx| {
            Ok(tx
                .prepare_cached(
                    "UPDATE alert_notices
                        SET last_error = ?3, next_attempt_at = ?4, claimed_by = NULL,
                            claimed_until = NULL
                      WHERE id = ?1 AND claimed_by = ?2 AND sent_at IS NULL",
                )?
                .execute(params![id, claimer, error, retry_at])?
                == 1)
        })
    }

    fn active_alerts(&self) -> StoreResult<Vec<ActiveAlert>> {
        self.read(|c| sql::alerts::active_alerts(&mut Sqlite(c)))
    }

    fn subjects(&self) -> StoreResult<Vec<AlertSubject>> {
        self.read(|c| sql::alerts::subjects(&mut Sqlite(c)))
    }

    fn failed_since(&self, since: i64) -> StoreResult<Vec<(String, i64)>> {
        self.read(|c| sql::alerts::failed_since(&mut Sqlite(c), since))
    }

    fn rejected_since(&self, since: i64) -> StoreResult<Vec<(String, i64)>> {
        self.read(|c| sql::alerts::rejected_since(&mut Sqlite(c), since))
    }
}
