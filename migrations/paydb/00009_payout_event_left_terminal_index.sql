-- paydb: the reconciler's INV-08 detective reports every payout whose
-- history holds a change out of POSTED, FAILED or ABANDONED (the
-- transition table has none: such a change is finished work executed
-- again). It reads them with each page of payout digests. This partial
-- index holds only such changes, so it is empty while the invariant holds
-- and costs nothing on the write path but the test of its predicate. Its
-- predicate must match payoutDigestsSQL in payment/digest.go literally.

-- +goose Up
CREATE INDEX IF NOT EXISTS payout_event_left_terminal_idx ON payout_event (payout_id COLLATE "C")
    WHERE from_state IN ('POSTED', 'FAILED', 'ABANDONED');

-- +goose Down
DROP INDEX IF EXISTS payout_event_left_terminal_idx;
