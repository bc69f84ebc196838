//! Cursor paging shared by `GET /events` and `GET /loyalty/{customer_id}`: newest first by the
//! store's sequence, an opaque cursor naming the last sequence seen, one row more than asked
//! to tell whether another page exists.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::ApiError;
use crate::store::Page;

pub const DEFAULT_LIMIT: usize = 50;
pub const MAX_LIMIT: usize = 500;

/// A cursor naming `seq` (public for the fuzz targets' round trip).
#[doc(hidden)]
pub fn encode_cursor(seq: i64) -> String {
    encode_tagged("v1", seq)
}

/// The cursor decoder of `GET /events` and `GET /loyalty/{customer_id}` (public for the fuzz
/// targets): any text is either a sequence this server issued or a 422 naming `cursor`.
#[doc(hidden)]
pub fn decode_cursor(cursor: &str) -> Result<i64, ApiError> {
    decode_tagged("v1", "cursor", cursor)
}

/// A sequence as opaque text; `tag` keeps one route's cursors out of another's.
pub(super) fn encode_tagged(tag: &str, seq: i64) -> String {
    URL_SAFE_NO_PAD.encode(format!("{tag}:{seq}"))
}

/// The sequence in a cursor that `encode_tagged(tag, _)` made, else a 422 naming `field`.
pub(super) fn decode_tagged(tag: &str, field: &str, cursor: &str) -> Result<i64, ApiError> {
    URL_SAFE_NO_PAD
        .decode(cursor)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| {
            s.strip_prefix(tag)?
                .strip_prefix(':')
                .and_then(|n| n.parse().ok())
        })
        .ok_or_else(|| {
            ApiError::InvalidRequest(format!("{field}: not a cursor this server issued"))
        })
}

/// A page request from the `limit` and `cursor` parameters as text; each bad value is a 422
/// naming its parameter.
#[derive(Debug, Clone, Copy)]
pub struct Paging {
    limit: usize,
    before_seq: Option<i64>,
}

impl Paging {
    pub fn parse(limit: Option<&str>, cursor: Option<&str>) -> Result<Paging, ApiError> {
        let limit = match limit {
            None => DEFAULT_LIMIT,
            Some(l) => l
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_LIMIT).contains(n))
                .ok_or_else(|| {
                    ApiError::InvalidRequest(format!(
                        "limit: `{l}` is not an integer from 1 to {MAX_LIMIT}"
                    ))
                })?,
        };
        let before_seq = cursor.map(decode_cursor).transpose()?;
        Ok(Paging { limit, before_seq })
    }

    /// What to ask the store for: one row more than the page.
    pub fn page(self) -> Page {
        Page {
            limit: self.limit + 1,
            before_seq: self.before_seq,
        }
    }

    /// Cut the store's rows to the page; the cursor of the next page, if there is one.
    pub fn finish<T>(self, rows: &mut Vec<T>, seq: impl Fn(&T) -> i64) -> Option<String> {
        if rows.len() > self.limit {
            rows.truncate(self.limit);
            rows.last().map(|r| encode_cursor(seq(r)))
        } else {
            None
        }
    }
}
