//! `GET /alerts`: the alerts whose episode is open now, as every node sees them (the store's
//! `alert_state`; see `crate::alerts`).

use actix_web::{HttpResponse, web};
use serde::Serialize;
use utoipa::ToSchema;

use super::auth::Admin;
use super::{ApiError, AppState, blocking};
use crate::domain::time::rfc3339;

/// An alert that started and has not cleared.
#[derive(Debug, Serialize, ToSchema)]
pub struct ActiveAlert {
    /// `channel/condition/subject`, e.g. `ops/breaker_open/billing`.
    alert: String,
    /// Counts the alert's episodes: the notices of this one carry it.
    episode: i64,
    /// When the condition started to hold.
    #[schema(format = DateTime)]
    since: String,
    /// The figure when it started.
    figure: String,
}

/// The open alerts.
#[derive(Debug, Serialize, ToSchema)]
pub struct ActiveAlerts {
    alerts: Vec<ActiveAlert>,
}

#[utoipa::path(get, path = "/alerts",
    operation_id = "listActiveAlerts", tag = "ops", security(("bearer" = [])),
    responses(
        (status = 200, description = "The alerts that started and have not cleared, by key", body = ActiveAlerts),
    ))]
pub async fn list(_: Admin, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let active = blocking(&state, |s| s.alerts().active_alerts()).await?;
    Ok(HttpResponse::Ok().json(ActiveAlerts {
        alerts: active
            .into_iter()
            .map(|a| ActiveAlert {
                alert: a.alert,
                episode: a.episode,
                since: rfc3339(a.since),
                figure: a.figure,
            })
            .collect(),
    }))
}
