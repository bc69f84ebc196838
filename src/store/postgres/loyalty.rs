//! The loyalty account's read: a customer's balance and credits.

use super::session::Db;
use crate::store::{LoyaltyAccount, LoyaltyCredit, Page, StoreResult};

/// The balance and one page of credits, newest first by the `seq` of the event that earned
/// each credit: the order and cursor of `GET /events`.
pub(super) fn account(
    db: &mut Db<'_>,
    customer_id: &str,
    page: Page,
) -> StoreResult<LoyaltyAccount> {
    let balance: i64 = match db.query_opt(
        "SELECT balance FROM loyalty_balances WHERE customer_id = $1",
        &[&customer_id],
    )? {
        Some(row) => row.try_get(0)?,
        None => 0,
    };
    let limit = i64::try_from(page.limit).unwrap_or(i64::MAX);
    let rows = db.query(
        "SELECT c.order_id, c.points, c.source, c.event_id, c.credited_at, e.seq
           FROM loyalty_credits c
           JOIN event_log e ON e.source = c.source AND e.event_id = c.event_id
          WHERE c.customer_id = $1 AND ($2::bigint IS NULL OR e.seq < $2)
          ORDER BY e.seq DESC LIMIT $3",
        &[&customer_id, &page.before_seq, &limit],
    )?;
    let credits = rows
        .iter()
        .map(|r| {
            Ok(LoyaltyCredit {
                order_id: r.try_get(0)?,
                points: r.try_get(1)?,
                source: r.try_get(2)?,
                event_id: r.try_get(3)?,
                credited_at: r.try_get(4)?,
                seq: r.try_get(5)?,
            })
        })
        .collect::<StoreResult<Vec<_>>>()?;
    Ok(LoyaltyAccount {
        customer_id: customer_id.to_string(),
        balance,
        credits,
    })
}
