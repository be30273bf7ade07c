-- Up Migration
-- Every instance caches the serialized category list and LISTENs on this channel;
-- one notification per changing statement is enough to invalidate (payload unused).
CREATE FUNCTION categories_notify_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('categories_changed', '');
  RETURN NULL;
END
$$;

CREATE TRIGGER categories_notify_change
  AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON categories
  FOR EACH STATEMENT EXECUTE FUNCTION categories_notify_change();

-- Down Migration
DROP TRIGGER categories_notify_change ON categories;
DROP FUNCTION categories_notify_change();
