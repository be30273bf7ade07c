-- Up Migration
-- One trigger function for every resource's table: a change to table T notifies the
-- channel T_changed with the writer's application_name (an instance skips the echo of
-- its own creates, which it has added to its cached list itself). A resource's
-- migration attaches it:
--   CREATE TRIGGER t_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON t
--     FOR EACH STATEMENT EXECUTE FUNCTION notify_table_change();
CREATE FUNCTION notify_table_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify(TG_TABLE_NAME || '_changed', current_setting('application_name'));
  RETURN NULL;
END
$$;

DROP TRIGGER categories_notify_change ON categories;
DROP FUNCTION categories_notify_change();
CREATE TRIGGER categories_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON categories
  FOR EACH STATEMENT EXECUTE FUNCTION notify_table_change();

-- Down Migration
DROP TRIGGER categories_changed ON categories;
CREATE FUNCTION categories_notify_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('categories_changed', current_setting('application_name'));
  RETURN NULL;
END
$$;
CREATE TRIGGER categories_notify_change AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON categories
  FOR EACH STATEMENT EXECUTE FUNCTION categories_notify_change();
DROP FUNCTION notify_table_change();
