-- Up Migration
-- The payload names the writer: the application_name of the session that changed
-- the table. Each instance's pool connects under its own unique name and applies its
-- own creates to its cached list itself, so it skips the echo of its own changes and
-- rebuilds the list only for changes that came from elsewhere. Instances that ignore
-- the payload keep working unchanged.
CREATE OR REPLACE FUNCTION categories_notify_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('categories_changed', current_setting('application_name'));
  RETURN NULL;
END
$$;

-- Down Migration
CREATE OR REPLACE FUNCTION categories_notify_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('categories_changed', '');
  RETURN NULL;
END
$$;
