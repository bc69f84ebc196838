-- Secrets kept once, in the database (as SQLite's migration 0016): older secrets beside the
-- current one during a rotation's grace, where each came from, a key of its own for a pull
-- subscription's claim tokens, and pull tokens kept only as SHA-256 digests.
ALTER TABLE subscription_secrets DROP CONSTRAINT subscription_secrets_pkey;
ALTER TABLE subscription_secrets DROP CONSTRAINT subscription_secrets_purpose_check;
ALTER TABLE subscription_secrets
    ADD COLUMN id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ADD COLUMN origin text NOT NULL DEFAULT 'generated' CHECK (origin IN ('generated', 'config')),
    ADD COLUMN expires_at bigint,
    ADD CONSTRAINT subscription_secrets_purpose_check
        CHECK (purpose IN ('signing', 'token', 'claims'));
CREATE UNIQUE INDEX subscription_secrets_current ON subscription_secrets (name, purpose)
    WHERE expires_at IS NULL;

-- A token kept plain becomes its digest; its claim tokens' key is the one the nodes derived
-- from it until now (`pull::claims_key_of`), so that claims made before the upgrade still ack.
INSERT INTO subscription_secrets (name, purpose, value, created_at)
SELECT name, 'claims',
       encode(sha256(convert_to('webhook-inbox pull claims', 'UTF8') || '\x00'::bytea
                     || convert_to(value, 'UTF8')), 'hex'),
       created_at
  FROM subscription_secrets
 WHERE purpose = 'token' AND value NOT LIKE 'sha256:%';
UPDATE subscription_secrets
   SET value = 'sha256:' || encode(sha256(convert_to(value, 'UTF8')), 'hex')
 WHERE purpose = 'token' AND value NOT LIKE 'sha256:%';
