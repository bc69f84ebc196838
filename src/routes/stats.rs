//! `GET /events/stats`: what the dashboard's overview shows, in one read.

use actix_web::{HttpResponse, web};
use serde_json::json;

use super::auth::Admin;
use super::{ApiError, AppState, blocking};
use crate::domain::time::{now_ms, rfc3339};

const MINUTE_MS: i64 = 60_000;
/// The window of `received_per_minute`: the current minute and the 59 before it.
const WINDOW_MINUTES: i64 = 60;

/// Events by status (each once, by its summary over its subscriptions), the oldest pending
/// event's age, and events received per minute over the
/// last hour (every minute listed, zeros included, oldest first). Events are counted by their
/// first delivery: a redelivery has no time of its own in the store beyond `last_delivered_at`.
#[utoipa::path(get, path = "/events/stats",
    operation_id = "getEventStats", tag = "ops", security(("bearer" = [])),
    responses((status = 200, description = "The overview", body = super::openapi::schemas::Stats)))]
pub async fn stats(_: Admin, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let now = now_ms();
    let current = now - now.rem_euclid(MINUTE_MS);
    let since = current - (WINDOW_MINUTES - 1) * MINUTE_MS;
    let (counts, events, minutes) = blocking(&state, move |s| {
        Ok((
            s.status_counts()?,
            s.event_counts()?,
            s.received_per_minute(since)?,
        ))
    })
    .await?;
    let per_minute: Vec<_> = (0..WINDOW_MINUTES)
        .map(|i| {
            let minute = since + i * MINUTE_MS;
            let count = minutes
                .iter()
                .find(|(m, _)| *m == minute)
                .map_or(0, |(_, n)| *n);
            json!({"minute": rfc3339(minute), "count": count})
        })
        .collect();
    let oldest_pending_seconds = counts.lag_seconds(now);
    Ok(HttpResponse::Ok().json(json!({
        // Events, each once by its summary (as the list shows them), not subscription states:
        // an event taken by three subscriptions is one event. Those not fanned out yet are
        // pending.
        "counts": {
            "pending": events.pending + counts.fan_out_waiting,
            "claimed": events.claimed,
            "completed": events.completed,
            "failed": events.failed,
        },
        "oldest_pending_seconds": oldest_pending_seconds,
        "received_per_minute": per_minute,
    })))
}
