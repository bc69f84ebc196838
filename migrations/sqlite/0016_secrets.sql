-- Secrets kept once, in the database (SPEC section 13): a subscription's secret of a purpose
-- may now have older ones beside the current one (a rotation's grace: each valid until its
-- `expires_at`), say where it came from (a node's config, or made by a node or the API), and
-- the claim tokens of a pull subscription get a key of their own (`claims`), since its bearer
-- token is kept only as a digest. Pull tokens kept plain by migration 0014 are turned into
-- digests by the store right after this file (SQLite has no SHA-256 in SQL: see
-- `store::sqlite::secrets::digest_plain_tokens`).
CREATE TABLE subscription_secrets_new (
    id         INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL,
    purpose    TEXT    NOT NULL
               CHECK (purpose = 'signing' OR purpose = 'token' OR purpose = 'claims'),
    -- `signing`: the secret (`whsec_…`), or it sealed (`sealed1:…`) when the nodes have a
    -- secrets key; `token`: `sha256:<hex>` of the token; `claims`: the key (hex), or sealed.
    value      TEXT    NOT NULL,
    origin     TEXT    NOT NULL DEFAULT 'generated'
               CHECK (origin = 'generated' OR origin = 'config'),
    created_at INTEGER NOT NULL,
    -- NULL: the current one. Else an older one, still valid until then.
    expires_at INTEGER
);
INSERT INTO subscription_secrets_new (name, purpose, value, created_at)
SELECT name, purpose, value, created_at FROM subscription_secrets ORDER BY name, purpose;
DROP TABLE subscription_secrets;
ALTER TABLE subscription_secrets_new RENAME TO subscription_secrets;
-- One current secret per subscription and purpose: two nodes making one at once keep one.
CREATE UNIQUE INDEX subscription_secrets_current ON subscription_secrets (name, purpose)
    WHERE expires_at IS NULL;
