-- paydb: the payment resource's continuous ledger check (every 30 s) sums
-- the groups with an entry created since shortly before its previous run.
-- Without an index on created_at that was a scan of the whole ledger on
-- every run: its cost grew with every payout ever posted (~0.27 s per
-- million payouts, both cores). Entries are appended in about the order
-- they are created, so a BRIN index (a few pages for millions of entries,
-- next to nothing per insert) finds the recent ones: a run reads the
-- newest page ranges only. Small ranges keep what a run reads close to
-- what changed; autosummarize keeps the newest ranges summarized.

-- +goose Up
CREATE INDEX IF NOT EXISTS ledger_entry_created_brin ON ledger_entry USING brin (created_at)
    WITH (pages_per_range = 32, autosummarize = on);

-- +goose Down
DROP INDEX IF EXISTS ledger_entry_created_brin;
