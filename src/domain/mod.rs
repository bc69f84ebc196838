//! Validated values, parsed once at the edge. Nothing downstream re-validates them.

mod consumers;
mod database;
mod order;
pub mod payload;
pub mod replay;
pub mod time;

pub use consumers::{ConsumerSettings, MAX_BACKOFF_MS};
pub use database::{Database, redact_credentials};
pub use order::{OrderCredit, OrderError};

use serde::Deserialize;

/// An error and its causes, one line (`error: cause: cause`): for a call's failure in an
/// event's `last_error` and the logs.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The source name the submission API uses for its own events (SPEC section 6).
pub const RESERVED_SOURCE: &str = "requests";

/// The event type the implicit `loyalty-credit` subscription takes (SPEC section 13).
pub const ORDER_COMPLETED: &str = "order.completed";

/// The shortest bearer token accepted (admin, submission and pull tokens alike): a token is
/// guessed online, and 16 random characters put that out of reach.
pub const MIN_TOKEN_LEN: usize = 16;

/// The event type of a submitted request (SPEC section 6), the `downstream` kind's.
pub const REQUEST_SUBMITTED: &str = "request.submitted";

/// What a handler's effect tolerates when its outcome is unknown (a lease ran out mid-call, a
/// call timed out): at most once gives up, at least once runs it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
pub enum DeliveryMode {
    #[serde(rename = "at-most-once")]
    AtMostOnce,
    #[serde(rename = "at-least-once")]
    AtLeastOnce,
}

impl DeliveryMode {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryMode::AtMostOnce => "at-most-once",
            DeliveryMode::AtLeastOnce => "at-least-once",
        }
    }

    /// As the registry keeps it (its `CHECK` allows these two).
    pub fn parse(s: &str) -> Option<DeliveryMode> {
        [DeliveryMode::AtMostOnce, DeliveryMode::AtLeastOnce]
            .into_iter()
            .find(|m| m.as_str() == s)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("must not be empty")]
    Empty,
    #[error("must be at most {0} characters")]
    TooLong(usize),
    #[error("must contain only letters, digits, `-`, `_` and `.`")]
    BadCharacter,
    #[error("must not contain control characters")]
    Control,
    /// `.` and `..` are path segments a browser or proxy removes (`/events/shop/../retry` is
    /// `/events/retry`), so an id made of dots cannot be addressed safely.
    #[error("must not be made only of dots")]
    OnlyDots,
}

/// A source name as it appears in `/webhooks/{source}` and the config.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SourceName(String);

impl SourceName {
    pub fn parse(s: &str) -> Result<SourceName, NameError> {
        if s.is_empty() {
            return Err(NameError::Empty);
        }
        if s.len() > 64 {
            return Err(NameError::TooLong(64));
        }
        if !s
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(NameError::BadCharacter);
        }
        // `/webhooks/..` is `/` to whoever normalises the path before it arrives.
        if s.bytes().all(|b| b == b'.') {
            return Err(NameError::OnlyDots);
        }
        Ok(SourceName(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A provider's event id: opaque text, bounded so that a hostile sender cannot bloat the key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EventId(String);

impl EventId {
    pub const MAX_LEN: usize = 255;

    pub fn parse(s: &str) -> Result<EventId, NameError> {
        Self::check(s.trim()).map(|s| EventId(s.to_string()))
    }

    /// [`EventId::parse`], keeping the string when it needs no trimming (no copy).
    pub fn parse_owned(s: String) -> Result<EventId, NameError> {
        match Self::check(s.trim())?.len() == s.len() {
            true => Ok(EventId(s)),
            false => Self::parse(&s),
        }
    }

    fn check(s: &str) -> Result<&str, NameError> {
        if s.is_empty() {
            return Err(NameError::Empty);
        }
        if s.len() > Self::MAX_LEN {
            return Err(NameError::TooLong(Self::MAX_LEN));
        }
        if s.chars().any(char::is_control) {
            return Err(NameError::Control);
        }
        if s.bytes().all(|b| b == b'.') {
            return Err(NameError::OnlyDots);
        }
        Ok(s)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::EventId;

    #[test]
    fn an_owned_event_id_parses_as_a_borrowed_one() {
        let long = "x".repeat(EventId::MAX_LEN + 1);
        for s in [
            "evt-1",
            "  evt-1\t",
            "",
            "   ",
            "a\u{7}b",
            "é",
            ".",
            " .. ",
            "..a",
            long.as_str(),
            &long[1..],
        ] {
            assert_eq!(
                EventId::parse_owned(s.to_string()).map(EventId::into_string),
                EventId::parse(s).map(EventId::into_string),
                "{s:?}"
            );
        }
    }

    #[test]
    fn ids_made_only_of_dots_are_refused_and_others_with_dots_are_not() {
        for bad in [".", "..", "...", " .. "] {
            assert_eq!(
                EventId::parse(bad),
                Err(super::NameError::OnlyDots),
                "{bad:?}"
            );
        }
        for good in ["..a", "a.b", ".x.", "v1.2"] {
            assert_eq!(EventId::parse(good).unwrap().as_str(), good);
        }
    }
}
