-- Up Migration
-- Idempotency records carry the operation they belong to: a key is scoped to its
-- owner and its operation, so one operation never replays another's answer.
-- Every record written before this column existed, and by an earlier version
-- still running during a rolling deploy, is a createCategory record: that is the
-- default (adding a column with a constant default rewrites nothing).
-- An earlier version's upsert names the old key (ON CONFLICT (key_owner,
-- idempotency_key)): its Idempotency-Key creates fail from this migration on, until
-- it is replaced. Keep the overlap of a rolling deploy short.
ALTER TABLE idempotency_keys ADD COLUMN operation text NOT NULL DEFAULT 'createCategory';
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_pkey;
ALTER TABLE idempotency_keys ADD PRIMARY KEY (key_owner, operation, idempotency_key);

-- Down Migration
DELETE FROM idempotency_keys WHERE operation <> 'createCategory';
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_pkey;
ALTER TABLE idempotency_keys ADD PRIMARY KEY (key_owner, idempotency_key);
ALTER TABLE idempotency_keys DROP COLUMN operation;
