-- paydb: the reconciler's read of every payout (GET /payout-digests) also
-- carries the state its history ends in (the to_state of its last event)
-- and the first change that does not start where the one before it ended:
-- the payment resource records every change it makes as an event in the
-- same statement, so a state that is not where the history ends, or a
-- history that jumps, was written outside its transition table (INV-08).
-- The index the read scans gets from_state and to_state, so the read stays
-- index-only; it replaces the index of 00004, which every lookup of one
-- payout's events used too.

-- +goose Up
CREATE INDEX IF NOT EXISTS payout_event_digest_idx ON payout_event (payout_id COLLATE "C", id)
    INCLUDE (token, from_state, to_state);
DROP INDEX IF EXISTS payout_event_payout_bytes_idx;

-- +goose Down
CREATE INDEX IF NOT EXISTS payout_event_payout_bytes_idx ON payout_event (payout_id COLLATE "C", id) INCLUDE (token);
DROP INDEX IF EXISTS payout_event_digest_idx;
