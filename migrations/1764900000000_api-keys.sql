-- Up Migration
-- Managed API keys (npm run keys): only the SHA-256 digest of a key is stored, never the key.
CREATE TABLE api_keys (
  id                    bigserial   PRIMARY KEY,
  name                  text        NOT NULL CHECK (char_length(name) BETWEEN 1 AND 255),
  scope                 text        NOT NULL CHECK (scope IN ('read', 'write')),
  prefix                text        NOT NULL,
  digest                bytea       NOT NULL UNIQUE CHECK (length(digest) = 32),
  rate_limit_per_minute integer     CHECK (rate_limit_per_minute > 0),
  created_at            timestamptz NOT NULL DEFAULT now(),
  expires_at            timestamptz,
  revoked_at            timestamptz,
  last_used_at          timestamptz
);
CREATE TRIGGER api_keys_inserted AFTER INSERT ON api_keys REFERENCING NEW TABLE AS inserted
  FOR EACH STATEMENT EXECUTE FUNCTION notify_table_insert();
-- Not last_used_at: recording a key's use must not make every instance read the keys again.
CREATE TRIGGER api_keys_changed
  AFTER UPDATE OF name, scope, digest, rate_limit_per_minute, expires_at, revoked_at OR DELETE OR TRUNCATE
  ON api_keys FOR EACH STATEMENT EXECUTE FUNCTION notify_table_change();

-- Down Migration
DROP TABLE api_keys;
