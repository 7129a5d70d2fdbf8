-- paydb: GET /work answers the accounts whose oldest actionable payout has
-- waited longest. Walking payout_actionable_idx (account_id, created_at)
-- finds every account with work, one probe each, before it can order
-- them: with a thousand accounts waiting, each call cost ~11 ms of
-- database CPU. This index holds the same payouts in the order they have
-- waited, so the first payouts it gives name those accounts: a call reads
-- about as many payouts as it returns accounts. Like
-- payout_actionable_idx, its predicate must match actionableSQL in
-- payment/store.go literally.

-- +goose Up
CREATE INDEX IF NOT EXISTS payout_waiting_idx ON payout (created_at, account_id)
    WHERE state IN ('PENDING', 'CLAIMED', 'RAIL_SUBMITTED', 'RAIL_ACKED');

-- +goose Down
DROP INDEX IF EXISTS payout_waiting_idx;
