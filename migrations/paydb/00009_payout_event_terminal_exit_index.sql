-- paydb: the reconciler's INV-08 detective reports every change of a payout
-- out of POSTED, FAILED or ABANDONED (the transition table has none: such a
-- change is finished work executed again). GET /v1/terminal-exits lists
-- them through this partial index, which holds only such changes: it is
-- empty while the invariant holds and costs nothing on the write path but
-- the test of its predicate. Its predicate must match terminalExitsSQL in
-- payment/store.go literally.

-- +goose Up
CREATE INDEX IF NOT EXISTS payout_event_terminal_exit_idx ON payout_event (id)
    WHERE from_state IN ('POSTED', 'FAILED', 'ABANDONED');

-- +goose Down
DROP INDEX IF EXISTS payout_event_terminal_exit_idx;
