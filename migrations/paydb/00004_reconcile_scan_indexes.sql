-- paydb: the reconciler streams every payout with its history's tokens
-- (GET /payout-digests) and merges that stream with the proxy's
-- submissions and the rail's settlement report by payout id. The three
-- sources must agree on the order, whatever collation a database was
-- created with, so the stream is in byte order (COLLATE "C"); these
-- indexes give it a keyset scan of payouts and an index-only range scan of
-- their events.

-- +goose Up
CREATE INDEX IF NOT EXISTS payout_id_bytes_idx ON payout (id COLLATE "C");
CREATE INDEX IF NOT EXISTS payout_event_payout_bytes_idx ON payout_event (payout_id COLLATE "C", id) INCLUDE (token);

-- +goose Down
DROP INDEX IF EXISTS payout_event_payout_bytes_idx;
DROP INDEX IF EXISTS payout_id_bytes_idx;
