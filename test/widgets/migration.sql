-- Up Migration
CREATE TABLE widgets (
  id   bigserial PRIMARY KEY,
  name text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 100)
);
CREATE TRIGGER widgets_inserted AFTER INSERT ON widgets REFERENCING NEW TABLE AS inserted
  FOR EACH STATEMENT EXECUTE FUNCTION notify_table_insert();
CREATE TRIGGER widgets_changed AFTER UPDATE OR DELETE OR TRUNCATE ON widgets
  FOR EACH STATEMENT EXECUTE FUNCTION notify_table_change();

-- Down Migration
DROP TABLE widgets;
