//! The submission API's tables. Submit is one transaction: the request becomes `submitted` and
//! its event is inserted through the same primary-key dedup as a webhook, so a double click
//! can never queue twice.

use rusqlite::{Connection, OptionalExtension, Transaction, params};

use super::{events, ingest};
use crate::store::{
    AddDocument, DocumentContent, DocumentSummary, InsertOutcome, NewDocument, RequestRecord,
    RequestStatus, StoreResult, SubmitOutcome,
};

/// The event every submission becomes (SPEC section 6).
pub const REQUEST_SOURCE: &str = crate::domain::RESERVED_SOURCE;

pub(super) fn create(tx: &Transaction<'_>, id: &str, now: i64) -> StoreResult<RequestRecord> {
    tx.execute(
        "INSERT INTO requests (id, created_at) VALUES (?1, ?2)",
        params![id, now],
    )?;
    Ok(RequestRecord {
        id: id.to_string(),
        status: RequestStatus::Draft,
        documents: Vec::new(),
        event: None,
    })
}

pub(super) fn get(conn: &Connection, id: &str) -> StoreResult<Option<RequestRecord>> {
    let status: Option<String> = conn
        .query_row("SELECT status FROM requests WHERE id = ?1", [id], |r| {
            r.get(0)
        })
        .optional()?;
    let Some(status) = status else {
        return Ok(None);
    };
    let status = if status == "submitted" {
        RequestStatus::Submitted
    } else {
        RequestStatus::Draft
    };
    let documents = documents(conn, id)?
        .into_iter()
        .map(|d| d.summary)
        .collect();
    let event = match status {
        RequestStatus::Submitted => events::detail(conn, &Default::default(), REQUEST_SOURCE, id)?
            .map(|detail| detail.event),
        RequestStatus::Draft => None,
    };
    Ok(Some(RequestRecord {
        id: id.to_string(),
        status,
        documents,
        event,
    }))
}

pub(super) fn documents(conn: &Connection, id: &str) -> StoreResult<Vec<DocumentContent>> {
    Ok(conn
        .prepare_cached(
            "SELECT id, name, content_type, length(content), content FROM request_documents
              WHERE request_id = ?1 ORDER BY position",
        )?
        .query_map([id], |r| {
            Ok(DocumentContent {
                summary: DocumentSummary {
                    id: r.get(0)?,
                    name: r.get(1)?,
                    content_type: r.get(2)?,
                    size: r.get(3)?,
                },
                content: r.get(4)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?)
}

/// The document is inserted only `WHERE status = 'draft'`, in the same statement: a document
/// racing a submit either lands before it or is refused, never after it.
pub(super) fn add_document(
    tx: &Transaction<'_>,
    request_id: &str,
    doc: &NewDocument,
    now: i64,
) -> StoreResult<AddDocument> {
    let added = tx.execute(
        "INSERT INTO request_documents (id, request_id, position, name, content_type, content,
                                        created_at)
         SELECT ?1, id, (SELECT count(*) FROM request_documents WHERE request_id = ?2),
                ?3, ?4, ?5, ?6
           FROM requests WHERE id = ?2 AND status = 'draft'",
        params![
            doc.id,
            request_id,
            doc.name,
            doc.content_type,
            doc.content,
            now
        ],
    )?;
    if added == 1 {
        let record = get(tx, request_id)?.expect("the request exists: a document was just added");
        return Ok(AddDocument::Added(Box::new(record)));
    }
    let exists: bool = tx.query_row(
        "SELECT EXISTS (SELECT 1 FROM requests WHERE id = ?1)",
        [request_id],
        |r| r.get(0),
    )?;
    Ok(if exists {
        AddDocument::Submitted
    } else {
        AddDocument::NotFound
    })
}

/// `draft -> submitted` and the event insert, in the caller's one transaction. Which answer the
/// caller gets is decided by the event's primary key, not by reading the status first.
pub(super) fn submit(
    tx: &Transaction<'_>,
    routes: &super::subscriptions::Routes,
    id: &str,
    now: i64,
) -> StoreResult<SubmitOutcome> {
    let found = tx.execute(
        "UPDATE requests SET status = 'submitted', submitted_at = coalesce(submitted_at, ?2)
          WHERE id = ?1",
        params![id, now],
    )?;
    if found == 0 {
        return Ok(SubmitOutcome::NotFound);
    }
    let delivery = crate::store::request_types::submitted(id, now);
    let outcome = ingest::insert_all(tx, std::slice::from_ref(&delivery), routes)?;
    Ok(match outcome[0] {
        InsertOutcome::Queued => SubmitOutcome::Queued,
        _ => SubmitOutcome::Duplicate,
    })
}
