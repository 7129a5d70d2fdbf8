-- paydb: where the rail's answer for a payout is kept (domain model 2.3:
-- "Outcome + rail reference recorded"). Written by POST /payouts/{id}/outcome.

-- +goose Up
ALTER TABLE payout ADD COLUMN IF NOT EXISTS rail_ref text;
ALTER TABLE payout ADD COLUMN IF NOT EXISTS rail_error_code text;
COMMENT ON COLUMN payout.rail_ref IS 'The rail''s own reference for the payment, when it gave one (ACKED outcome).';
COMMENT ON COLUMN payout.rail_error_code IS 'The rail''s decline or error code, when it gave one (REJECTED or TIMEOUT outcome).';

-- +goose Down
ALTER TABLE payout DROP COLUMN IF EXISTS rail_error_code;
ALTER TABLE payout DROP COLUMN IF EXISTS rail_ref;
