-- Deliveries refused at the edge (unknown source, bad signature, stale timestamp, oversize, bad
-- body, forbidden sender), kept so that "why does the provider say our endpoint fails?" has an
-- answer. Bounded: the writer trims to a count and an age after each batch. Header values that
-- could hold a secret are never stored (their names are).
CREATE TABLE rejections (
    id INTEGER PRIMARY KEY,
    received_at INTEGER NOT NULL,
    source TEXT NOT NULL,
    peer TEXT,
    reason TEXT NOT NULL,
    status INTEGER NOT NULL,
    message TEXT NOT NULL,
    headers TEXT NOT NULL,
    body_bytes INTEGER,
    body_sha256 TEXT
);
CREATE INDEX rejections_by_source ON rejections (source, id);
CREATE INDEX rejections_by_time ON rejections (received_at);

-- A copy into this database that has not finished (`webhook-inbox copy`): set under the copy's
-- exclusive hold before its first row, cleared after its last. A node refuses to start while
-- it is there, also after the copy's process died half way.
CREATE TABLE copy_in_progress (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    started_at INTEGER NOT NULL
);
