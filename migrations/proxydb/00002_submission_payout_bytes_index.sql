-- proxydb: the reconciler reads every submission attempt ordered by payout
-- id (GET /submission-digests) to merge it with the payouts and the rail's
-- settlement report; the order is byte order (COLLATE "C") so that every
-- source agrees on it whatever collation the database was created with.

-- +goose Up
CREATE INDEX IF NOT EXISTS rail_submission_payout_bytes_idx ON rail_submission (payout_id COLLATE "C", id)
    INCLUDE (account_id, fence_token, holder, outcome, resolution);

-- +goose Down
DROP INDEX IF EXISTS rail_submission_payout_bytes_idx;
