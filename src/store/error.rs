//! What a store answers when it cannot: unavailable (a 503, not acknowledged) or internal.

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not answer in time (pool exhausted, write lock held too long). The HTTP
    /// edge answers 503 with `Retry-After`: not acknowledged. Usually nothing was committed,
    /// but a commit whose fsync failed is on disk all the same (a retry is then a duplicate).
    #[error("store unavailable: {0}")]
    Unavailable(Unavailable),
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl StoreError {
    /// Unavailable for a reason of its own (a wait that ran out).
    pub fn unavailable(what: impl Into<String>) -> StoreError {
        StoreError::Unavailable(Unavailable {
            what: what.into(),
            cause: None,
        })
    }

    /// Unavailable because of `cause`, which is kept (not flattened into text) so that the
    /// log line of a 503 shows its whole chain.
    pub fn unavailable_because(
        what: impl Into<String>,
        cause: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> StoreError {
        StoreError::Unavailable(Unavailable {
            what: what.into(),
            cause: Some(cause.into()),
        })
    }
}

/// Why the store could not answer: what failed, and the error underneath when there is one.
/// Its text is the whole chain (`what: cause: cause`), so that wherever it is shown (a log
/// line, a start-up error, an event's `last_error`) the cause is there; the cause is not
/// repeated as the error's `source`, which would print it twice in a chain.
#[derive(Debug)]
pub struct Unavailable {
    what: String,
    cause: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.chain())
    }
}

impl std::error::Error for Unavailable {}

impl Unavailable {
    /// The error underneath, kept as it was raised.
    pub fn cause(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        self.cause.as_deref()
    }

    /// What failed and every cause under it, `what: cause: cause`: for a log line or an
    /// event's `last_error`.
    pub fn chain(&self) -> String {
        let mut out = self.what.clone();
        let mut next: Option<&(dyn std::error::Error + 'static)> = self
            .cause
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static));
        while let Some(e) = next {
            out.push_str(": ");
            out.push_str(&e.to_string());
            next = e.source();
        }
        out
    }
}

pub type StoreResult<T> = Result<T, StoreError>;
