-- paydb: the payment resource's store (guard 1). See DESIGN.md §3 and D-1, D-7, D-14.
--
-- The fence lives on the account row; the guard rule (D-1) is enforced by the
-- payment service in one conditional UPDATE. This schema adds the integrity the
-- database can carry on its own: money is integral minor units, ledger entries
-- are append-only, every ledger group sums to zero at commit, and evidence
-- (payout events, safety events) is never edited or deleted.

-- +goose Up

-- Immutability guard shared by the append-only tables. Raised with SQLSTATE
-- 23001 (restrict_violation) and a CONSTRAINT name of '<table>_append_only', so
-- a caller can tell it apart from other errors.
-- +goose StatementBegin
CREATE FUNCTION append_only_violation() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'restrict_violation',
              CONSTRAINT = TG_TABLE_NAME || '_append_only',
              TABLE = TG_TABLE_NAME,
              HINT = 'corrections are new rows, never edits';
END;
$$;
-- +goose StatementEnd

-- TRUNCATE bypasses row triggers; every table here refuses it.
-- +goose StatementBegin
CREATE FUNCTION truncate_refused() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'TRUNCATE % refused: rows are never deleted', TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation',
              CONSTRAINT = TG_TABLE_NAME || '_no_truncate',
              TABLE = TG_TABLE_NAME;
END;
$$;
-- +goose StatementEnd

CREATE TABLE account (
    id           text        PRIMARY KEY CHECK (id <> ''),
    currency     text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    balance      bigint      NOT NULL,
    fence_token  bigint      NOT NULL DEFAULT 0 CHECK (fence_token >= 0),
    fence_holder text        NOT NULL DEFAULT '',
    version      bigint      NOT NULL DEFAULT 0 CHECK (version >= 0),
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    -- target of payout's composite foreign key: a payout's currency is its account's.
    CONSTRAINT account_id_currency_key UNIQUE (id, currency)
);
COMMENT ON TABLE account IS 'Accounts funds are paid out from; the unit of locking (key payout:{id}) and the carrier of the authoritative fence. Never deleted. System accounts (funding, payout-clearing) are ordinary rows created by the payment service.';
COMMENT ON COLUMN account.balance IS 'Integer minor units; a cached projection of the ledger (sum of this account''s ledger_entry.amount), updated in the same transaction as the entries. May be negative for system accounts: funds are checked by the service (D-7), not by a constraint.';
COMMENT ON COLUMN account.fence_token IS 'Highest fencing token accepted for this account (D-1). Non-decreasing; 0 = never fenced.';
COMMENT ON COLUMN account.fence_holder IS 'Session id of the grant that set fence_token (D-1); equal token + different holder means a re-issued token.';
COMMENT ON COLUMN account.version IS 'Optimistic version for ordinary application concurrency; not a guard.';

-- +goose StatementBegin
CREATE FUNCTION account_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'account % is never deleted', OLD.id
            USING ERRCODE = 'restrict_violation', CONSTRAINT = 'account_never_deleted', TABLE = 'account';
    END IF;
    IF NEW.id IS DISTINCT FROM OLD.id
       OR NEW.currency IS DISTINCT FROM OLD.currency
       OR NEW.created_at IS DISTINCT FROM OLD.created_at THEN
        RAISE EXCEPTION 'account %: id, currency and created_at are immutable', OLD.id
            USING ERRCODE = 'restrict_violation', CONSTRAINT = 'account_identity_immutable', TABLE = 'account';
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER account_guard BEFORE UPDATE OR DELETE ON account
    FOR EACH ROW EXECUTE FUNCTION account_guard();
CREATE TRIGGER account_no_truncate BEFORE TRUNCATE ON account
    FOR EACH STATEMENT EXECUTE FUNCTION truncate_refused();

CREATE TABLE payout (
    id              text        PRIMARY KEY CHECK (id <> ''),
    account_id      text        NOT NULL,
    amount          bigint      NOT NULL CHECK (amount > 0 AND amount < 1000000000000000),
    currency        text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    beneficiary_ref text        NOT NULL CHECK (beneficiary_ref <> ''),
    state           text        NOT NULL DEFAULT 'PENDING' CHECK (state IN (
                        'PENDING', 'CLAIMED', 'RAIL_SUBMITTED', 'RAIL_ACKED',
                        'RAIL_AMBIGUOUS', 'POSTED', 'FAILED', 'ABANDONED')),
    client_ref      text        NOT NULL CHECK (client_ref <> ''),
    claimed_by      text,
    token           bigint      CHECK (token > 0),
    failure_reason  text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    claimed_at      timestamptz,
    submitted_at    timestamptz,
    settled_at      timestamptz,
    CONSTRAINT payout_client_ref_key UNIQUE (client_ref),
    CONSTRAINT payout_account_fkey FOREIGN KEY (account_id, currency)
        REFERENCES account (id, currency)
);
CREATE INDEX payout_account_state_idx ON payout (account_id, state);
CREATE INDEX payout_state_idx ON payout (state);
COMMENT ON TABLE payout IS 'One instruction to move a fixed amount out of one account, exactly once. Created PENDING; terminal at POSTED, FAILED, ABANDONED; never deleted. Transitions are enforced by the payment service (INV-08).';
COMMENT ON COLUMN payout.amount IS 'Integer minor units, 0 < amount < 10^15 (D-14).';
COMMENT ON COLUMN payout.client_ref IS 'Stable reference the rail sees: fixed prefix + payout id (D-10). Never regenerated.';
COMMENT ON COLUMN payout.claimed_by IS 'Identity (session id) of the current or last claiming holder.';
COMMENT ON COLUMN payout.token IS 'Token of the last fenced write: diagnostic only, never a guard (the fence is account.fence_token).';

-- +goose StatementBegin
CREATE FUNCTION payout_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'payout % is never deleted', OLD.id
            USING ERRCODE = 'restrict_violation', CONSTRAINT = 'payout_never_deleted', TABLE = 'payout';
    END IF;
    IF NEW.id IS DISTINCT FROM OLD.id
       OR NEW.account_id IS DISTINCT FROM OLD.account_id
       OR NEW.amount IS DISTINCT FROM OLD.amount
       OR NEW.currency IS DISTINCT FROM OLD.currency
       OR NEW.beneficiary_ref IS DISTINCT FROM OLD.beneficiary_ref
       OR NEW.client_ref IS DISTINCT FROM OLD.client_ref
       OR NEW.created_at IS DISTINCT FROM OLD.created_at THEN
        RAISE EXCEPTION 'payout %: id, account_id, amount, currency, beneficiary_ref, client_ref and created_at are immutable', OLD.id
            USING ERRCODE = 'restrict_violation', CONSTRAINT = 'payout_identity_immutable', TABLE = 'payout';
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER payout_guard BEFORE UPDATE OR DELETE ON payout
    FOR EACH ROW EXECUTE FUNCTION payout_guard();
CREATE TRIGGER payout_no_truncate BEFORE TRUNCATE ON payout
    FOR EACH STATEMENT EXECUTE FUNCTION truncate_refused();

CREATE TABLE ledger_entry (
    id                      bigserial   PRIMARY KEY,
    group_id                text        NOT NULL CHECK (group_id <> ''),
    account_id              text        NOT NULL REFERENCES account (id),
    amount                  bigint      NOT NULL CHECK (amount <> 0),
    counterparty_account_id text        NOT NULL REFERENCES account (id),
    payout_id               text        REFERENCES payout (id),
    token                   bigint      CHECK (token > 0),
    created_at              timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT ledger_entry_counterparty_differs CHECK (counterparty_account_id <> account_id)
);
CREATE INDEX ledger_entry_group_idx ON ledger_entry (group_id);
CREATE INDEX ledger_entry_account_idx ON ledger_entry (account_id, id);
CREATE INDEX ledger_entry_payout_idx ON ledger_entry (payout_id) WHERE payout_id IS NOT NULL;
COMMENT ON TABLE ledger_entry IS 'Immutable double-entry record; the only source of truth about money. Append-only (UPDATE, DELETE, TRUNCATE raise); every group sums to zero at commit (deferred constraint trigger). A correction is a new compensating group.';
COMMENT ON COLUMN ledger_entry.group_id IS 'Transaction group shared by all entries of one movement; the entries of a group sum to zero.';
COMMENT ON COLUMN ledger_entry.amount IS 'Signed integer minor units: negative debits the account, positive credits it.';
COMMENT ON COLUMN ledger_entry.counterparty_account_id IS 'The other leg''s account (payout-clearing for a payout, funding for an opening balance).';
COMMENT ON COLUMN ledger_entry.payout_id IS 'The payout that caused the movement; NULL for opening balances.';
COMMENT ON COLUMN ledger_entry.token IS 'Fencing token the entry was posted under (postmortem evidence); NULL when not posted under a grant (opening balances).';

CREATE TRIGGER ledger_entry_append_only BEFORE UPDATE OR DELETE ON ledger_entry
    FOR EACH ROW EXECUTE FUNCTION append_only_violation();
CREATE TRIGGER ledger_entry_no_truncate BEFORE TRUNCATE ON ledger_entry
    FOR EACH STATEMENT EXECUTE FUNCTION truncate_refused();

-- Runs at COMMIT (or SET CONSTRAINTS ... IMMEDIATE) once per inserted row.
-- Each committed group sums to zero, so a transaction passes only if its own
-- rows balance every group they touch. sum(bigint) is numeric: no overflow.
-- +goose StatementBegin
CREATE FUNCTION ledger_entry_group_balanced() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    total numeric;
BEGIN
    SELECT sum(amount) INTO total FROM ledger_entry WHERE group_id = NEW.group_id;
    IF total IS DISTINCT FROM 0 THEN
        RAISE EXCEPTION 'ledger group % does not sum to zero (sum %)', NEW.group_id, total
            USING ERRCODE = 'check_violation',
                  CONSTRAINT = 'ledger_entry_group_sums_to_zero',
                  TABLE = 'ledger_entry';
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE CONSTRAINT TRIGGER ledger_entry_group_sums_to_zero
    AFTER INSERT ON ledger_entry
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION ledger_entry_group_balanced();

CREATE TABLE payout_event (
    id         bigserial   PRIMARY KEY,
    payout_id  text        NOT NULL REFERENCES payout (id),
    from_state text        CHECK (from_state IN (
                   'PENDING', 'CLAIMED', 'RAIL_SUBMITTED', 'RAIL_ACKED',
                   'RAIL_AMBIGUOUS', 'POSTED', 'FAILED', 'ABANDONED')),
    to_state   text        NOT NULL CHECK (to_state IN (
                   'PENDING', 'CLAIMED', 'RAIL_SUBMITTED', 'RAIL_ACKED',
                   'RAIL_AMBIGUOUS', 'POSTED', 'FAILED', 'ABANDONED')),
    token      bigint      CHECK (token > 0),
    holder     text,
    actor      text        NOT NULL,
    reason     text,
    at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX payout_event_payout_idx ON payout_event (payout_id, id);
COMMENT ON TABLE payout_event IS 'Audit trail of payout state changes (claim history for the reconciler, operator cancel/abandon). Append-only.';
COMMENT ON COLUMN payout_event.from_state IS 'NULL for the creation event.';
COMMENT ON COLUMN payout_event.token IS 'Token presented with the change; NULL when none (creation).';
COMMENT ON COLUMN payout_event.actor IS 'Who acted: executor owner, reconciler, or operator identity.';

CREATE TRIGGER payout_event_append_only BEFORE UPDATE OR DELETE ON payout_event
    FOR EACH ROW EXECUTE FUNCTION append_only_violation();
CREATE TRIGGER payout_event_no_truncate BEFORE TRUNCATE ON payout_event
    FOR EACH STATEMENT EXECUTE FUNCTION truncate_refused();

CREATE TABLE safety_event (
    id              bigserial   PRIMARY KEY,
    kind            text        NOT NULL CHECK (kind IN ('fenced_out', 'token_regression', 'rejected_transition')),
    key             text,
    presented_token bigint,
    stored_token    bigint,
    holder          text,
    stored_holder   text,
    payout_id       text,
    detail          text,
    at              timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX safety_event_kind_idx ON safety_event (kind, id);
COMMENT ON TABLE safety_event IS 'Evidence that a safety net fired (fenced_out, token_regression, rejected_transition). Target: zero rows. Written in a transaction of its own (D-1). Append-only.';
COMMENT ON COLUMN safety_event.key IS 'Lock key, payout:{account_id}.';
COMMENT ON COLUMN safety_event.payout_id IS 'Payout the rejected request named, if any; deliberately not a foreign key (the request may name a payout that does not exist).';

CREATE TRIGGER safety_event_append_only BEFORE UPDATE OR DELETE ON safety_event
    FOR EACH ROW EXECUTE FUNCTION append_only_violation();
CREATE TRIGGER safety_event_no_truncate BEFORE TRUNCATE ON safety_event
    FOR EACH STATEMENT EXECUTE FUNCTION truncate_refused();

-- +goose Down
DROP TABLE safety_event;
DROP TABLE payout_event;
DROP TABLE ledger_entry;
DROP TABLE payout;
DROP TABLE account;
DROP FUNCTION ledger_entry_group_balanced();
DROP FUNCTION payout_guard();
DROP FUNCTION account_guard();
DROP FUNCTION truncate_refused();
DROP FUNCTION append_only_violation();
