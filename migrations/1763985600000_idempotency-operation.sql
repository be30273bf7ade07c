-- Up Migration
-- Idempotency records carry the operation they belong to. A key stays unique per
-- owner (the primary key is unchanged): a key already used for one operation is
-- refused for another (422), never replayed as the other's answer.
-- Every record written before this column existed, and by an earlier version still
-- running during a rolling deploy, is a createCategory record: that is the default
-- (adding a column with a constant default rewrites nothing). Earlier versions'
-- statements (ON CONFLICT (key_owner, idempotency_key), the same advisory lock per
-- owner and key) keep working against this table.
ALTER TABLE idempotency_keys ADD COLUMN operation text NOT NULL DEFAULT 'createCategory';

-- Down Migration
DELETE FROM idempotency_keys WHERE operation <> 'createCategory';
ALTER TABLE idempotency_keys DROP COLUMN operation;
