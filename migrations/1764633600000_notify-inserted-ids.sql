-- Up Migration
-- An insert announces the ids it inserted (comma-separated, ascending): every instance adds
-- exactly those rows to its cached list, read by primary key, instead of dropping the list.
-- A payload stays under PostgreSQL's 8000-byte limit: a larger insert says '*', and any
-- other change (update, delete, truncate) says '', both meaning "drop the list". A
-- resource's migration attaches both functions:
--   CREATE TRIGGER t_inserted AFTER INSERT ON t REFERENCING NEW TABLE AS inserted
--     FOR EACH STATEMENT EXECUTE FUNCTION notify_table_insert();
--   CREATE TRIGGER t_changed AFTER UPDATE OR DELETE OR TRUNCATE ON t
--     FOR EACH STATEMENT EXECUTE FUNCTION notify_table_change();
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

CREATE OR REPLACE FUNCTION notify_table_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify(TG_TABLE_NAME || '_changed', '');
  RETURN NULL;
END
$$;

DROP TRIGGER categories_changed ON categories;
CREATE TRIGGER categories_inserted AFTER INSERT ON categories REFERENCING NEW TABLE AS inserted
  FOR EACH STATEMENT EXECUTE FUNCTION notify_table_insert();
CREATE TRIGGER categories_changed AFTER UPDATE OR DELETE OR TRUNCATE ON categories
  FOR EACH STATEMENT EXECUTE FUNCTION notify_table_change();

-- Down Migration
DROP TRIGGER categories_changed ON categories;
DROP TRIGGER categories_inserted ON categories;
CREATE OR REPLACE FUNCTION notify_table_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify(TG_TABLE_NAME || '_changed', current_setting('application_name'));
  RETURN NULL;
END
$$;
CREATE TRIGGER categories_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON categories
  FOR EACH STATEMENT EXECUTE FUNCTION notify_table_change();
DROP FUNCTION notify_table_insert();
