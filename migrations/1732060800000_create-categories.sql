-- Up Migration
CREATE TABLE categories (
  id          bigserial PRIMARY KEY,
  name        text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 255),
  description text CHECK (char_length(description) <= 2000)
);

-- Down Migration
DROP TABLE categories;
