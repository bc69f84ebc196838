-- The submission API (SPEC section 6): a request is built up as a draft, then submitted once.
CREATE TABLE requests (
    id           TEXT    NOT NULL PRIMARY KEY,
    status       TEXT    NOT NULL DEFAULT 'draft' CHECK (status IN ('draft', 'submitted')),
    created_at   INTEGER NOT NULL,
    submitted_at INTEGER,
    CHECK ((status = 'submitted') = (submitted_at IS NOT NULL))
) WITHOUT ROWID;

CREATE TABLE request_documents (
    id           TEXT    NOT NULL PRIMARY KEY,
    request_id   TEXT    NOT NULL REFERENCES requests (id),
    position     INTEGER NOT NULL,
    name         TEXT    NOT NULL,
    content_type TEXT    NOT NULL,
    content      BLOB    NOT NULL,
    created_at   INTEGER NOT NULL,
    UNIQUE (request_id, position)
) WITHOUT ROWID;
