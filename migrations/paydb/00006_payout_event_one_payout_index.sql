-- paydb: payout_event had two indexes on payout_id: payout_event_payout_idx
-- (the database's collation) and payout_event_payout_bytes_idx (byte
-- order, migration 00004, for the reconciler's ordered scan). Every event
-- row was written into both. The lookups of one payout's events now
-- compare payout_id in byte order (an equality means the same in every
-- deterministic collation), so the byte-order index serves them and the
-- other one goes.

-- +goose Up
DROP INDEX IF EXISTS payout_event_payout_idx;

-- +goose Down
CREATE INDEX IF NOT EXISTS payout_event_payout_idx ON payout_event (payout_id, id);
