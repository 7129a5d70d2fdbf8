-- paydb: GET /work and the executor's "what next" list read only the
-- payouts that still need a worker. This partial index holds exactly those,
-- so both cost O(accounts with work) instead of O(every payout ever made).
-- The state list must match the literal list in payment/store.go
-- (actionableSQL) for the planner to use the index.

-- +goose Up
CREATE INDEX IF NOT EXISTS payout_actionable_idx ON payout (account_id, created_at)
    WHERE state IN ('PENDING', 'CLAIMED', 'RAIL_SUBMITTED', 'RAIL_ACKED');

-- +goose Down
DROP INDEX IF EXISTS payout_actionable_idx;
