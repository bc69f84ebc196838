//! A subscription as the registry keeps it, and changed through the API (SPEC section 13,
//! `POST` and `PATCH /subscriptions`): the kind's settings as the JSON of the `settings`
//! column, a registered subscription back as the fields of its config table, and a patch
//! applied to those fields, then checked by the config's own [`validate`].

use serde::{Deserialize, Serialize};

use super::settings::{SubscriptionSettings, validate};
use super::{FieldError, HttpTarget, Kind, Subscription};
use crate::domain::ConsumerSettings;
use crate::domain::DeliveryMode;

/// An `http` subscription's settings as the registry's `settings` column holds them: what
/// every node's forwarder calls with, whatever its own config says. Never the secrets
/// (`subscription_secrets`), never shown whole (the URL may hold credentials).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpSettings {
    pub url: String,
    pub timeout_ms: u64,
    pub concurrency: usize,
    pub rate_per_second: u32,
    pub ca_file: Option<String>,
    /// `nats` only; absent from the column of an `http` one (and of rows written before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creds_file: Option<String>,
    /// `amqp` only, as `subject` and `stream` are `nats`'s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exchange: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_key: Option<String>,
}

impl HttpSettings {
    pub fn of(target: &HttpTarget) -> HttpSettings {
        HttpSettings {
            url: target.url.clone(),
            timeout_ms: target.timeout_ms,
            concurrency: target.concurrency,
            rate_per_second: target.rate_per_second,
            ca_file: target.ca_file.clone(),
            subject: target.subject.clone(),
            stream: target.stream.clone(),
            creds_file: target.creds_file.clone(),
            exchange: target.exchange.clone(),
            routing_key: target.routing_key.clone(),
        }
    }

    /// The column's text for `sub` (`None` for the kinds without settings).
    pub fn column(sub: &Subscription) -> Option<String> {
        sub.http
            .as_ref()
            .and_then(|t| serde_json::to_string(&HttpSettings::of(t)).ok())
    }

    /// From the column's text; `None` when there is none (a row written before migration
    /// 0015, until a node whose config names it starts) or it does not parse.
    pub fn parse(text: Option<&str>) -> Option<HttpSettings> {
        serde_json::from_str(text?).ok()
    }

    /// The target, signing with `secrets`.
    pub fn target(&self, secrets: Vec<crate::signature::Secret>) -> HttpTarget {
        HttpTarget {
            url: self.url.clone(),
            subject: self.subject.clone(),
            stream: self.stream.clone(),
            creds_file: self.creds_file.clone(),
            exchange: self.exchange.clone(),
            routing_key: self.routing_key.clone(),
            signing_secrets: secrets,
            timeout_ms: self.timeout_ms,
            ca_file: self.ca_file.clone(),
            concurrency: self.concurrency,
            rate_per_second: self.rate_per_second,
        }
    }
}

/// A registered subscription as the fields of its config table, each one explicit (defaults
/// filled in), without its secrets: what a `PATCH` is laid over.
fn settings_of(sub: &Subscription) -> SubscriptionSettings {
    let http = sub.http.as_ref();
    SubscriptionSettings {
        name: sub.name.clone(),
        kind: sub.kind,
        sources: sub.route.sources.clone(),
        types: sub.route.types.clone(),
        url: http.map(|t| t.url.clone()),
        subject: http.and_then(|t| t.subject.clone()),
        stream: http.and_then(|t| t.stream.clone()),
        creds_file: http.and_then(|t| t.creds_file.clone()),
        exchange: http.and_then(|t| t.exchange.clone()),
        routing_key: http.and_then(|t| t.routing_key.clone()),
        signing_secret: None,
        timeout_ms: http.map(|t| t.timeout_ms),
        ca_file: http.and_then(|t| t.ca_file.clone()),
        concurrency: http.map(|t| t.concurrency),
        rate_per_second: http.map(|t| t.rate_per_second),
        mode: Some(sub.mode),
        max_attempts: Some(sub.max_attempts),
        backoff_base_ms: Some(sub.backoff_base_ms),
        backoff_max_ms: Some(sub.backoff_max_ms),
        token: None,
        ordered_by: sub.ordering.as_ref().map(|o| o.pointer.clone()),
        on_failure: sub.ordering.as_ref().map(|o| o.on_failure),
        filter: sub.filter.as_ref().map(super::filter::Filter::to_json),
        transform: sub.transform.as_ref().map(|t| t.as_str().to_string()),
    }
}

/// A body that does not read as a subscription's fields (an unknown field, a wrong type, a
/// missing `name` or `kind`), as the field it names.
pub fn body_error(e: serde_path_to_error::Error<serde_json::Error>) -> FieldError {
    let path = e.path().to_string();
    let message = e.inner().to_string();
    // serde names an unknown or missing field in its message, at the top (`.`).
    let named = ["unknown field `", "missing field `"]
        .iter()
        .find_map(|p| message.split_once(p)?.1.split_once('`').map(|(f, _)| f));
    FieldError {
        field: match named {
            Some(field) if path == "." => field.to_string(),
            _ => path.trim_end_matches("[]").to_string(),
        },
        message,
    }
}

/// `current` with the fields of `patch` laid over it (a field given as `null` goes back to
/// its default), checked as the config is, but for the contents of its files (`ca_file`,
/// `creds_file`): this runs in the registry's writing transaction, on whichever node took the
/// request, so the caller checks a changed file ([`check_ca_file`](super::check_ca_file),
/// [`check_creds_file`](super::check_creds_file)) before it, and an unchanged one is not read
/// again (a node without the file could otherwise change nothing of the subscription). `name`
/// and `kind` are not changed by a patch: a subscription of another kind is another
/// subscription.
pub fn patched(
    current: &Subscription,
    patch: &serde_json::Map<String, serde_json::Value>,
    consumers: &ConsumerSettings,
    downstream_mode: DeliveryMode,
) -> Result<Subscription, FieldError> {
    for field in ["name", "kind"] {
        if patch.contains_key(field) {
            return Err(FieldError {
                field: field.into(),
                message: "cannot be changed: delete the subscription and create another".into(),
            });
        }
    }
    let mut fields = serde_json::to_value(settings_of(current)).map_err(|e| FieldError {
        field: "name".into(),
        message: format!("the registered subscription does not read back: {e}"),
    })?;
    if let Some(object) = fields.as_object_mut() {
        for (key, value) in patch {
            object.insert(key.clone(), value.clone());
        }
    }
    let mut merged: SubscriptionSettings =
        serde_path_to_error::deserialize(fields).map_err(body_error)?;
    let ca_file = match merged.kind {
        kind if kind.is_call_out() => merged.ca_file.take(),
        _ => None,
    };
    let creds_file = match merged.kind {
        Kind::Nats => merged.creds_file.take(),
        _ => None,
    };
    let mut sub = validate(&merged, consumers, downstream_mode)?;
    if let Some(target) = sub.http.as_mut() {
        target.ca_file = ca_file.filter(|f| !f.is_empty());
        target.creds_file = creds_file.filter(|f| !f.is_empty());
    }
    // The implicit `audit`'s "every other event" is no field of a config table: a patch of
    // anything else keeps it, or `audit` would start taking `order.completed` beside `loyalty`.
    sub.route.except_types = current.route.except_types.clone();
    Ok(sub)
}

/// The secrets a subscription signs or is claimed with, as `subscription_secrets` keeps them:
/// `(purpose, value)`, several signing secrets (a rotation) separated by spaces (neither a
/// `whsec_` secret nor a token holds one).
pub fn kept_secrets(sub: &Subscription) -> Vec<(&'static str, String)> {
    let mut kept = Vec::new();
    if let Some(target) = sub.http.as_ref().filter(|t| !t.signing_secrets.is_empty()) {
        let list: Vec<&str> = target.signing_secrets.iter().map(|s| s.expose()).collect();
        kept.push(("signing", list.join(" ")));
    }
    if let Some(token) = &sub.token {
        kept.push(("token", token.expose().to_string()));
    }
    kept
}

impl Kind {
    /// What a subscription of this kind is given once when it is created without one: a
    /// signing secret (`http`), a token (`pull`).
    pub fn generated_secret(self) -> Option<&'static str> {
        match self {
            Kind::Http => Some("signing"),
            Kind::Pull => Some("token"),
            _ => None,
        }
    }
}
