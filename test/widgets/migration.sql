-- Up Migration
CREATE TABLE widgets (
  id   bigserial PRIMARY KEY,
  name text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 100)
);
SELECT announce_changes('widgets');

-- Down Migration
DROP TABLE widgets;
