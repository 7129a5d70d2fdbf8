-- paydb: every posting credits one account, payout-clearing. Crediting its
-- balance row made every posting of every account wait for that row's lock,
-- held through the commit (the WAL flush) of the posting before it: postings
-- ran one at a time. Its balance is now kept in parts: a posting adds its
-- total to the part its paying account hashes to, so postings of different
-- accounts rarely meet on one row. An account's balance is account.balance
-- plus the sum of its parts (the balance is still the cached sum of the
-- account's ledger entries, INV-03; the ledger check compares the two).

-- +goose Up
CREATE TABLE account_balance_part (
    account_id text        NOT NULL REFERENCES account (id),
    part       smallint    NOT NULL CHECK (part >= 0 AND part < 64),
    amount     bigint      NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, part)
);
COMMENT ON TABLE account_balance_part IS 'Parts of the balance of an account that every posting credits (payout-clearing): its balance is account.balance plus the sum of its parts. A posting adds to the part its paying account hashes to. Rows are never deleted.';
CREATE TRIGGER account_balance_part_never_deleted BEFORE DELETE ON account_balance_part
    FOR EACH ROW EXECUTE FUNCTION append_only_violation();
CREATE TRIGGER account_balance_part_no_truncate BEFORE TRUNCATE ON account_balance_part
    FOR EACH STATEMENT EXECUTE FUNCTION truncate_refused();

-- +goose Down
-- The parts are folded back into the balances before the table goes.
UPDATE account a SET balance = a.balance + p.total, updated_at = now()
  FROM (SELECT account_id, sum(amount) AS total FROM account_balance_part GROUP BY account_id) p
 WHERE a.id = p.account_id AND p.total <> 0;
DROP TABLE account_balance_part;
