//! The submission API's tables, on either store. Submit is one transaction: the request
//! becomes `submitted` and its event is inserted through the same key dedup as a webhook
//! (the store's own insert), so a double click, on one node or two, can never queue twice.

use super::{Conn, Dialect, Value};
use crate::store::{
    AddDocument, DocumentContent, DocumentSummary, InsertOutcome, NewDelivery, NewDocument,
    RequestRecord, RequestStatus, StoreResult, SubmitOutcome,
};

/// The event every submission becomes (SPEC section 6).
pub const REQUEST_SOURCE: &str = crate::domain::RESERVED_SOURCE;

pub fn create(conn: &mut impl Conn, id: &str, now: i64) -> StoreResult<RequestRecord> {
    conn.execute(
        "INSERT INTO requests (id, created_at) VALUES (?1, ?2)",
        &[Value::Text(id.into()), Value::Int(now)],
    )?;
    Ok(RequestRecord {
        id: id.to_string(),
        status: RequestStatus::Draft,
        documents: Vec::new(),
        event: None,
    })
}

pub fn get(conn: &mut impl Conn, id: &str) -> StoreResult<Option<RequestRecord>> {
    let Some(row) = conn.query_opt(
        "SELECT status FROM requests WHERE id = ?1",
        &[Value::Text(id.into())],
    )?
    else {
        return Ok(None);
    };
    let status = if row.text(0)? == "submitted" {
        RequestStatus::Submitted
    } else {
        RequestStatus::Draft
    };
    let documents = documents(conn, id)?
        .into_iter()
        .map(|d| d.summary)
        .collect();
    let event = match status {
        RequestStatus::Submitted => {
            super::view::detail(conn, &[], REQUEST_SOURCE, id)?.map(|detail| detail.event)
        }
        RequestStatus::Draft => None,
    };
    Ok(Some(RequestRecord {
        id: id.to_string(),
        status,
        documents,
        event,
    }))
}

pub fn documents(conn: &mut impl Conn, id: &str) -> StoreResult<Vec<DocumentContent>> {
    conn.query(
        "SELECT id, name, content_type, length(content), content FROM request_documents
          WHERE request_id = ?1 ORDER BY position",
        &[Value::Text(id.into())],
    )?
    .iter()
    .map(|r| {
        Ok(DocumentContent {
            summary: DocumentSummary {
                id: r.text(0)?,
                name: r.text(1)?,
                content_type: r.text(2)?,
                size: r.int(3)?,
            },
            content: r.bytes(4)?,
        })
    })
    .collect()
}

/// The request's row is read (PostgreSQL: locked) first: a document racing a submit either
/// lands before it or finds the request submitted, never after it; and two documents added
/// at once take positions one after the other.
pub fn add_document<C: Conn>(
    conn: &mut C,
    request_id: &str,
    doc: &NewDocument,
    now: i64,
) -> StoreResult<AddDocument> {
    let Some(row) = conn.query_opt(
        &format!(
            "SELECT status FROM requests WHERE id = ?1 {}",
            C::Dialect::lock("requests")
        ),
        &[Value::Text(request_id.into())],
    )?
    else {
        return Ok(AddDocument::NotFound);
    };
    if row.text(0)? != "draft" {
        return Ok(AddDocument::Submitted);
    }
    conn.execute(
        "INSERT INTO request_documents (id, request_id, position, name, content_type, content,
                                        created_at)
         VALUES (?1, ?2, (SELECT count(*) FROM request_documents WHERE request_id = ?2),
                 ?3, ?4, ?5, ?6)",
        &[
            Value::Text(doc.id.clone()),
            Value::Text(request_id.into()),
            Value::Text(doc.name.clone()),
            Value::Text(doc.content_type.clone()),
            Value::Bytes(doc.content.clone()),
            Value::Int(now),
        ],
    )?;
    let record = get(conn, request_id)?.expect("the request exists: it was read just now");
    Ok(AddDocument::Added(Box::new(record)))
}

/// `draft -> submitted` and the event's insert by the store (`insert`), in the caller's one
/// transaction. Which answer the caller gets is decided by the event's key, not by reading
/// the status first.
pub fn submit<C: Conn>(
    conn: &mut C,
    id: &str,
    now: i64,
    insert: impl FnOnce(&mut C, &NewDelivery) -> StoreResult<InsertOutcome>,
) -> StoreResult<SubmitOutcome> {
    let found = conn.execute(
        "UPDATE requests SET status = 'submitted', submitted_at = coalesce(submitted_at, ?2)
          WHERE id = ?1",
        &[Value::Text(id.into()), Value::Int(now)],
    )?;
    if found == 0 {
        return Ok(SubmitOutcome::NotFound);
    }
    let delivery = crate::store::request_types::submitted(id, now);
    Ok(match insert(conn, &delivery)? {
        InsertOutcome::Queued => SubmitOutcome::Queued,
        _ => SubmitOutcome::Duplicate,
    })
}
