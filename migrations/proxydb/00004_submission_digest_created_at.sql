-- proxydb: the reconciler's read of every submission attempt (GET
-- /submission-digests) also carries when each was written: a submission's
-- grant is looked up in the lock service's grant log unless it was written
-- before the log's retention, and that age must be the submission's own
-- (a resubmission by a later holder is written long after its payout
-- became RAIL_SUBMITTED). The index the read scans gets created_at, so the
-- read stays index-only; it replaces the index of 00002.

-- +goose Up
CREATE INDEX IF NOT EXISTS rail_submission_digest_idx ON rail_submission (payout_id COLLATE "C", id)
    INCLUDE (account_id, fence_token, holder, outcome, resolution, created_at);
DROP INDEX IF EXISTS rail_submission_payout_bytes_idx;

-- +goose Down
CREATE INDEX IF NOT EXISTS rail_submission_payout_bytes_idx ON rail_submission (payout_id COLLATE "C", id)
    INCLUDE (account_id, fence_token, holder, outcome, resolution);
DROP INDEX IF EXISTS rail_submission_digest_idx;
