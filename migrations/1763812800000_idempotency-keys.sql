-- Up Migration
-- Idempotency-Key records for POST /v1/categories (contract: createCategory).
-- Scoped to the API key by its SHA-256 digest (never the key itself).
CREATE TABLE idempotency_keys (
  key_owner       bytea       NOT NULL,
  idempotency_key text        NOT NULL,
  request_hash    bytea       NOT NULL,
  state           text        NOT NULL CHECK (state IN ('running', 'done')),
  -- The request that holds a 'running' record; a record whose holder died can be taken over after locked_until.
  claim_token     uuid        NOT NULL,
  locked_until    timestamptz NOT NULL,
  response_status integer,
  response_body   text,
  location        text,
  expires_at      timestamptz NOT NULL,
  PRIMARY KEY (key_owner, idempotency_key)
);
CREATE INDEX idempotency_keys_expires_at ON idempotency_keys (expires_at);

-- Down Migration
DROP TABLE idempotency_keys;
