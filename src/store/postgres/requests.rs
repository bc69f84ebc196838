//! The submission API's tables. Submit is one transaction: the request becomes `submitted` and
//! its event is inserted through the same unique-key dedup as a webhook, so a double click (on
//! one node or two) can never queue twice.

use super::session::Db;
use super::{events, ingest};
use crate::store::{
    AddDocument, DocumentContent, DocumentSummary, InsertOutcome, NewDocument, RequestRecord,
    RequestStatus, StoreResult, SubmitOutcome,
};

/// The event every submission becomes (SPEC section 6), as on SQLite.
const REQUEST_SOURCE: &str = crate::domain::RESERVED_SOURCE;

pub(super) fn create(db: &mut Db<'_>, id: &str, now: i64) -> StoreResult<RequestRecord> {
    db.execute(
        "INSERT INTO requests (id, created_at) VALUES ($1, $2)",
        &[&id, &now],
    )?;
    Ok(RequestRecord {
        id: id.to_string(),
        status: RequestStatus::Draft,
        documents: Vec::new(),
        event: None,
    })
}

pub(super) fn get(db: &mut Db<'_>, id: &str) -> StoreResult<Option<RequestRecord>> {
    let Some(row) = db.query_opt("SELECT status FROM requests WHERE id = $1", &[&id])? else {
        return Ok(None);
    };
    let status: String = row.try_get(0)?;
    let status = if status == "submitted" {
        RequestStatus::Submitted
    } else {
        RequestStatus::Draft
    };
    let documents = documents(db, id)?.into_iter().map(|d| d.summary).collect();
    let event = match status {
        RequestStatus::Submitted => {
            events::detail(db, &Default::default(), REQUEST_SOURCE, id)?.map(|detail| detail.event)
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

pub(super) fn documents(db: &mut Db<'_>, id: &str) -> StoreResult<Vec<DocumentContent>> {
    db.query(
        "SELECT id, name, content_type, octet_length(content)::bigint, content
           FROM request_documents WHERE request_id = $1 ORDER BY position",
        &[&id],
    )?
    .iter()
    .map(|r| {
        Ok(DocumentContent {
            summary: DocumentSummary {
                id: r.try_get(0)?,
                name: r.try_get(1)?,
                content_type: r.try_get(2)?,
                size: r.try_get(3)?,
            },
            content: r.try_get(4)?,
        })
    })
    .collect()
}

/// The request's row is locked first: a document racing a submit (on any node) either lands
/// before it or finds the request submitted, never after it; and two documents added at once
/// take positions one after the other.
pub(super) fn add_document(
    db: &mut Db<'_>,
    request_id: &str,
    doc: &NewDocument,
    now: i64,
) -> StoreResult<AddDocument> {
    let Some(row) = db.query_opt(
        "SELECT status FROM requests WHERE id = $1 FOR UPDATE",
        &[&request_id],
    )?
    else {
        return Ok(AddDocument::NotFound);
    };
    let status: String = row.try_get(0)?;
    if status != "draft" {
        return Ok(AddDocument::Submitted);
    }
    db.execute(
        "INSERT INTO request_documents (id, request_id, position, name, content_type, content,
                                        created_at)
         VALUES ($1, $2, (SELECT count(*) FROM request_documents WHERE request_id = $2),
                 $3, $4, $5, $6)",
        &[
            &doc.id,
            &request_id,
            &doc.name,
            &doc.content_type,
            &doc.content,
            &now,
        ],
    )?;
    let record = get(db, request_id)?.expect("the request exists: its row is locked");
    Ok(AddDocument::Added(Box::new(record)))
}

/// `draft -> submitted` and the event insert, in one transaction. Which answer the caller gets
/// is decided by the event's unique key, not by reading the status first.
pub(super) fn submit(
    db: &mut Db<'_>,
    routes: &super::subscriptions::RouteCache,
    id: &str,
    now: i64,
) -> StoreResult<SubmitOutcome> {
    let found = db.execute(
        "UPDATE requests SET status = 'submitted', submitted_at = coalesce(submitted_at, $2)
          WHERE id = $1",
        &[&id, &now],
    )?;
    if found == 0 {
        return Ok(SubmitOutcome::NotFound);
    }
    let delivery = crate::store::request_types::submitted(id, now);
    let outcome = ingest::insert_all(db, std::slice::from_ref(&delivery), routes)?;
    Ok(match outcome[0] {
        InsertOutcome::Queued => SubmitOutcome::Queued,
        _ => SubmitOutcome::Duplicate,
    })
}
