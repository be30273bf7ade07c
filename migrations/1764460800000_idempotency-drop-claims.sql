-- Up Migration
-- A key's work is one transaction holding a transaction-scoped advisory lock; nothing
-- about a request in flight is ever committed, so records need no claim columns.
ALTER TABLE idempotency_keys DROP COLUMN state, DROP COLUMN claim_token, DROP COLUMN locked_until;

-- Down Migration
ALTER TABLE idempotency_keys
  ADD COLUMN state text NOT NULL DEFAULT 'done' CHECK (state IN ('running', 'done')),
  ADD COLUMN claim_token uuid NOT NULL DEFAULT gen_random_uuid(),
  ADD COLUMN locked_until timestamptz NOT NULL DEFAULT now();
