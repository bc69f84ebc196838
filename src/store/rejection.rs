//! The shapes of a delivery refused at the edge (see `crate::rejections`).

/// A delivery refused at the edge, as the route saw it (see `crate::rejections`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRejection {
    pub received_at: i64,
    /// The source named in the path (it may be no configured source).
    pub source: String,
    pub peer: Option<String>,
    /// The error code of the answer (`invalid_signature`, `unknown_source`, …).
    pub reason: String,
    pub status: u16,
    pub message: String,
    /// A JSON object of header name to value, the value `null` where it may hold a secret.
    pub headers: String,
    /// The body's size when it was read (else the declared `Content-Length`, if any).
    pub body_bytes: Option<i64>,
    /// The body's SHA-256 in hex, when it was read.
    pub body_sha256: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectionRecord {
    pub id: i64,
    pub rejection: NewRejection,
}

#[derive(Debug, Clone, Default)]
pub struct RejectionFilter {
    pub source: Option<String>,
    pub reason: Option<String>,
    pub received_after: Option<i64>,
    pub received_before: Option<i64>,
}
