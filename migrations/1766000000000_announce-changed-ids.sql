-- Up Migration
-- Updates and deletes announce their ids as inserts do, so that every instance changes just those rows of its
-- cached list: the baseline's notify_table_change said only that something changed, which dropped the whole list.
-- A resource's migration calls announce_changes('<table>') for its four statement triggers:
--   inserted  (notify_table_insert: the ids),
--   updated   (notify_table_update: 'updated:', the transaction id, ':', the ids),
--   deleted   (notify_table_delete: 'deleted:' and the ids),
--   truncated (notify_table_change: '').
-- Past the 8000-byte payload limit a statement announces '*', which, like '', drops the list everywhere.

-- An update announces the ids before and after it (an id that changed is one row gone and another come), and its
-- transaction id, the xmin of the rows it wrote: the instance that made the update knows its own echo by it.
CREATE FUNCTION notify_table_update() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  ids text;
BEGIN
  SELECT string_agg(id::text, ',' ORDER BY id) INTO ids
  FROM (SELECT id FROM old_rows UNION SELECT id FROM new_rows) AS changed;
  IF ids IS NOT NULL THEN
    PERFORM pg_notify(TG_TABLE_NAME || '_changed',
      CASE WHEN length(ids) <= 7880 THEN 'updated:' || txid_current() % 4294967296 || ':' || ids ELSE '*' END);
  END IF;
  RETURN NULL;
END
$$;

CREATE FUNCTION notify_table_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  ids text;
BEGIN
  SELECT string_agg(id::text, ',' ORDER BY id) INTO ids FROM old_rows;
  IF ids IS NOT NULL THEN
    PERFORM pg_notify(TG_TABLE_NAME || '_changed', CASE WHEN length(ids) <= 7900 THEN 'deleted:' || ids ELSE '*' END);
  END IF;
  RETURN NULL;
END
$$;

-- Replaces whatever change-notification triggers the table had with the four above (the start checks them).
CREATE FUNCTION announce_changes(resource text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  suffix text;
BEGIN
  FOREACH suffix IN ARRAY ARRAY['inserted', 'changed', 'updated', 'deleted', 'truncated'] LOOP
    EXECUTE format('DROP TRIGGER IF EXISTS %I ON %I', resource || '_' || suffix, resource);
  END LOOP;
  EXECUTE format('CREATE TRIGGER %I AFTER INSERT ON %I REFERENCING NEW TABLE AS inserted '
    'FOR EACH STATEMENT EXECUTE FUNCTION notify_table_insert()', resource || '_inserted', resource);
  EXECUTE format('CREATE TRIGGER %I AFTER UPDATE ON %I REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows '
    'FOR EACH STATEMENT EXECUTE FUNCTION notify_table_update()', resource || '_updated', resource);
  EXECUTE format('CREATE TRIGGER %I AFTER DELETE ON %I REFERENCING OLD TABLE AS old_rows '
    'FOR EACH STATEMENT EXECUTE FUNCTION notify_table_delete()', resource || '_deleted', resource);
  EXECUTE format('CREATE TRIGGER %I AFTER TRUNCATE ON %I '
    'FOR EACH STATEMENT EXECUTE FUNCTION notify_table_change()', resource || '_truncated', resource);
END
$$;

SELECT announce_changes('categories');

-- Down Migration
DROP TRIGGER categories_updated ON categories;
DROP TRIGGER categories_deleted ON categories;
DROP TRIGGER categories_truncated ON categories;
CREATE TRIGGER categories_changed AFTER UPDATE OR DELETE OR TRUNCATE ON categories
  FOR EACH STATEMENT EXECUTE FUNCTION notify_table_change();
DROP FUNCTION announce_changes(text);
DROP FUNCTION notify_table_delete();
DROP FUNCTION notify_table_update();
