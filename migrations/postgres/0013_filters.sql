-- A subscription's filter (SPEC section 13, issue 61), as SQLite's migration 0020: conditions
-- on the body as JSON text, compiled into the fan-out statement; NULL for none.
ALTER TABLE subscriptions ADD COLUMN filter text;

-- The body as jsonb, or NULL when it is not JSON or not UTF-8: what a filter reads, once per
-- event of a fan-out batch that a filtered subscription's route takes. (PostgreSQL 15 has no
-- `pg_input_is_valid`: the exception block is the safe cast, as for the order key.)
CREATE FUNCTION webhook_inbox_json_body(body bytea) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN convert_from(body, 'UTF8')::jsonb;
EXCEPTION WHEN others THEN
    RETURN NULL;
END
$$;
