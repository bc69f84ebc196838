//! The alert state and the notice outbox on PostgreSQL (see `store::alerts`).
//!
//! Several nodes run the same evaluation at about the same time. Under READ COMMITTED, the
//! conditional `UPDATE ... WHERE active = 0` of the second node waits for the first one's row
//! lock, then evaluates its condition again against the committed row, finds `active = 1` and
//! changes nothing: it writes no notice. The claim of notices locks the rows it takes
//! (`SKIP LOCKED`) and repeats its conditions in the outer `WHERE`, which PostgreSQL checks
//! again against a row another claim changed meanwhile.

use postgres::Row;

use super::PostgresStore;
use super::session::Db;
use crate::store::alerts::{ActiveAlert, AlertStore, AlertSubject, Notice, Observation};
use crate::store::{StoreResult, sql};

const NOTICE: &str = "id, alert, episode, phase, channel, title, figure, since, link, \
                      created_at, attempts";

fn notice(r: &Row) -> StoreResult<Notice> {
    Ok(Notice {
        id: r.try_get(0)?,
        alert: r.try_get(1)?,
        episode: r.try_get(2)?,
        phase: r.try_get(3)?,
        channel: r.try_get(4)?,
        title: r.try_get(5)?,
        figure: r.try_get(6)?,
        since: r.try_get(7)?,
        link: r.try_get(8)?,
        created_at: r.try_get(9)?,
        attempts: r.try_get(10)?,
    })
}

fn write_notice(
    db: &mut Db<'_>,
    o: &Observation,
    episode: i64,
    phase: &str,
    since: i64,
    now: i64,
) -> StoreResult<Option<Notice>> {
    let sql = format!(
        "INSERT INTO alert_notices (alert, episode, phase, channel, title, figure, since, link,
                                    created_at, next_attempt_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9)
         ON CONFLICT (alert, episode, phase) DO NOTHING
         RETURNING {NOTICE}"
    );
    db.query_opt(
        &sql,
        &[
            &o.alert, &episode, &phase, &o.channel, &o.title, &o.figure, &since, &o.link, &now,
        ],
    )?
    .map(|r| notice(&r))
    .transpose()
}

fn observe_one(db: &mut Db<'_>, o: &Observation, now: i64) -> StoreResult<Option<Notice>> {
    if o.holding {
        db.execute(
            "INSERT INTO alert_state (alert, holding_since) VALUES ($1, $2)
             ON CONFLICT (alert) DO UPDATE
                SET holding_since = coalesce(alert_state.holding_since, excluded.holding_since)",
            &[&o.alert, &now],
        )?;
        let due = now - o.for_ms;
        let started = db.query_opt(
            "UPDATE alert_state
                SET active = true, episode = episode + 1, started_at = holding_since,
                    figure = $3, changed_at = $4
              WHERE alert = $1 AND NOT active AND holding_since <= $2
                AND (changed_at IS NULL OR changed_at < $4)
             RETURNING episode, started_at",
            &[&o.alert, &due, &o.figure, &now],
        )?;
        return match started {
            Some(r) => write_notice(db, o, r.try_get(0)?, "started", r.try_get(1)?, now),
            None => Ok(None),
        };
    }
    let cleared = db.query_opt(
        "UPDATE alert_state SET active = false, holding_since = NULL, changed_at = $2
          WHERE alert = $1 AND active AND (changed_at IS NULL OR changed_at < $2)
         RETURNING episode, started_at",
        &[&o.alert, &now],
    )?;
    match cleared {
        Some(r) => write_notice(db, o, r.try_get(0)?, "cleared", r.try_get(1)?, now),
        None => {
            db.execute(
                "UPDATE alert_state SET holding_since = NULL
                  WHERE alert = $1 AND NOT active AND holding_since <= $2",
                &[&o.alert, &now],
            )?;
            Ok(None)
        }
    }
}

impl AlertStore for PostgresStore {
    fn observe(&self, observations: &[Observation], now: i64) -> StoreResult<Vec<Notice>> {
        self.tx(|db| {
            let mut written = Vec::new();
            for o in observations {
                written.extend(observe_one(db, o, now)?);
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
                SET claimed_by = $2, claimed_until = $3 + $4, attempts = attempts + 1
              WHERE id IN (SELECT id FROM alert_notices n
                            WHERE channel = $1 AND sent_at IS NULL AND next_attempt_at <= $3
                              AND (claimed_until IS NULL OR claimed_until <= $3)
                              AND attempts < $5
                              -- In order within an alert: not while an earlier notice of it
                              -- (its started one) waits to be sent or retried.
                              AND NOT EXISTS (SELECT 1 FROM alert_notices e
                                               WHERE e.alert = n.alert AND e.id < n.id
                                                 AND e.sent_at IS NULL AND e.attempts < $5)
                            ORDER BY id LIMIT $6 FOR UPDATE SKIP LOCKED)
                AND sent_at IS NULL AND (claimed_until IS NULL OR claimed_until <= $3)
             RETURNING {NOTICE}"
        );
        let limit = limit as i64;
        self.tx(|db| {
            let rows = db.query(
                &sql,
                &[&channel, &claimer, &now, &lease_ms, &max_attempts, &limit],
            )?;
            let mut claimed = rows.iter().map(notice).collect::<StoreResult<Vec<_>>>()?;
            claimed.sort_by_key(|n| n.id);
            Ok(claimed)
        })
    }

    fn notice_sent(&self, id: i64, claimer: &str, now: i64) -> StoreResult<bool> {
        self.tx(|db| {
            Ok(db.execute(
                "UPDATE alert_notices SET sent_at = $3, claimed_by = NULL, claimed_until = NULL
                  WHERE id = $1 AND claimed_by = $2 AND sent_at IS NULL",
                &[&id, &claimer, &now],
            )? == 1)
        })
    }

    fn notice_failed(
        &self,
        id: i64,
        claimer: &str,
        error: &str,
        retry_at: i64,
    ) -> StoreResult<bool> {
        self.tx(|db| {
            Ok(db.execute(
                "UPDATE alert_notices
                    SET last_error = $3, next_attempt_at = $4, claimed_by = NULL,
                        claimed_until = NULL
                  WHERE id = $1 AND claimed_by = $2 AND sent_at IS NULL",
                &[&id, &claimer, &error, &retry_at],
            )? == 1)
        })
    }

    fn active_alerts(&self) -> StoreResult<Vec<ActiveAlert>> {
        self.tx(|db| sql::alerts::active_alerts(db))
    }

    fn subjects(&self) -> StoreResult<Vec<AlertSubject>> {
        self.tx(|db| sql::alerts::subjects(db))
    }

    fn failed_since(&self, since: i64) -> StoreResult<Vec<(String, i64)>> {
        self.tx(|db| sql::alerts::failed_since(db, since))
    }

    fn rejected_since(&self, since: i64) -> StoreResult<Vec<(String, i64)>> {
        self.tx(|db| sql::alerts::rejected_since(db, since))
    }
}
