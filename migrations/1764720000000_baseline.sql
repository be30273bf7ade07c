-- Up Migration
-- The 1.0 schema. Every resource's table notifies <table>_changed through two statement triggers
-- (every instance's cached list hears of changes; the start refuses a table without them):
--   CREATE TRIGGER t_inserted AFTER INSERT ON t REFERENCING NEW TABLE AS inserted
--     FOR EACH STATEMENT EXECUTE FUNCTION notify_table_insert();
--   CREATE TRIGGER t_changed AFTER UPDATE OR DELETE OR TRUNCATE ON t
--     FOR EACH STATEMENT EXECUTE FUNCTION notify_table_change();

-- An insert announces its ids (ascending, comma-separated) so that instances add exactly those rows;
-- past PostgreSQL's 8000-byte payload limit it says '*', which, like '' (any other change), drops the list.
CREATE FUNCTION notify_table_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  ids text;
BEGIN
  SELECT string_agg(id::text, ',' ORDER BY id) INTO ids FROM inserted;
  IF ids IS NOT NULL THEN
    PERFORM pg_notify(TG_TABLE_NAME || '_changed', CASE WHEN length(ids) <= 7900 THEN ids ELSE '*' END);
  END IF;
  RETURN NULL;
END
$$;

CREATE FUNCTION notify_table_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify(TG_TABLE_NAME || '_changed', '');
  RETURN NULL;
END
$$;

CREATE TABLE categories (
  id          bigserial PRIMARY KEY,
  name        text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 255),
  description text CHECK (char_length(description) <= 2000)
);
CREATE TRIGGER categories_inserted AFTER INSERT ON categories REFERENCING NEW TABLE AS inserted
  FOR EACH STATEMENT EXECUTE FUNCTION notify_table_insert();
CREATE TRIGGER categories_changed AFTER UPDATE OR DELETE OR TRUNCATE ON categories
  FOR EACH STATEMENT EXECUTE FUNCTION notify_table_change();

-- Idempotency-Key records of every create, scoped to the API key by its SHA-256 digest (never the key).
CREATE TABLE idempotency_keys (
  key_owner       bytea       NOT NULL,
  idempotency_key text        NOT NULL,
  operation       text        NOT NULL,
  request_hash    bytea       NOT NULL,
  response_status integer     NOT NULL,
  response_body   text        NOT NULL,
  location        text,
  expires_at      timestamptz NOT NULL,
  PRIMARY KEY (key_owner, idempotency_key)
);
CREATE INDEX idempotency_keys_expires_at ON idempotency_keys (expires_at);

-- Down Migration
DROP TABLE idempotency_keys;
DROP TABLE categories;
DROP FUNCTION notify_table_change();
DROP FUNCTION notify_table_insert();
