-- proxydb: the rail proxy's store (guard 2). See DESIGN.md §3 and D-1, D-4, D-5, D-6.
--
-- The high-water guard (D-1) is enforced by the proxy in one conditional
-- statement. This schema carries "at most one forwarded submission per payout,
-- ever" (INV-02) as a partial unique index, and makes a submission's record of
-- intent, outcome and resolution write-once.

-- +goose Up

-- +goose StatementBegin
CREATE FUNCTION append_only_violation() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'restrict_violation',
              CONSTRAINT = TG_TABLE_NAME || '_append_only',
              TABLE = TG_TABLE_NAME;
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

CREATE TABLE account_high_water (
    account_id text        PRIMARY KEY CHECK (account_id <> ''),
    token      bigint      NOT NULL CHECK (token > 0),
    holder     text        NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE account_high_water IS 'The proxy''s own copy of the highest token seen per account (guard 2). Independent of paydb''s account fence; advanced conditionally in the same transaction as the submission intent.';
COMMENT ON COLUMN account_high_water.token IS 'Highest fencing token accepted for this account; non-decreasing.';
COMMENT ON COLUMN account_high_water.holder IS 'Session id of the grant that set token (D-1).';

-- +goose StatementBegin
CREATE FUNCTION account_high_water_never_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'account_high_water % is never deleted', OLD.account_id
        USING ERRCODE = 'restrict_violation', CONSTRAINT = 'account_high_water_never_deleted', TABLE = 'account_high_water';
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER account_high_water_never_deleted BEFORE DELETE ON account_high_water
    FOR EACH ROW EXECUTE FUNCTION account_high_water_never_deleted();
CREATE TRIGGER account_high_water_no_truncate BEFORE TRUNCATE ON account_high_water
    FOR EACH STATEMENT EXECUTE FUNCTION truncate_refused();

CREATE TABLE rail_submission (
    id                  bigserial   PRIMARY KEY,
    payout_id           text        NOT NULL CHECK (payout_id <> ''),
    account_id          text        NOT NULL CHECK (account_id <> ''),
    fence_token         bigint      NOT NULL CHECK (fence_token > 0),
    holder              text        NOT NULL,
    client_ref          text        NOT NULL CHECK (client_ref <> ''),
    amount              bigint      NOT NULL CHECK (amount > 0 AND amount < 1000000000000000),
    currency            text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    beneficiary_ref     text        NOT NULL CHECK (beneficiary_ref <> ''),
    outcome             text        CHECK (outcome IN ('ACKED', 'REJECTED', 'TIMEOUT', 'FENCED')),
    rail_ref            text,
    error_code          text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    outcome_at          timestamptz,
    resolution          text        CHECK (resolution IN ('SETTLED', 'ABSENT')),
    resolution_evidence text,
    resolution_at       timestamptz,
    CONSTRAINT rail_submission_outcome_at CHECK ((outcome IS NULL) = (outcome_at IS NULL)),
    CONSTRAINT rail_submission_resolution_at CHECK ((resolution IS NULL) = (resolution_at IS NULL)),
    -- A FENCED attempt was never forwarded: nothing to resolve, no rail reference.
    CONSTRAINT rail_submission_fenced_not_forwarded CHECK (
        outcome IS DISTINCT FROM 'FENCED' OR (resolution IS NULL AND rail_ref IS NULL))
);
-- D-5: at most one forwarded submission per payout, ever (INV-02). FENCED
-- attempts are evidence only and fall outside the index. Insert with
--   ON CONFLICT (payout_id) WHERE outcome IS DISTINCT FROM 'FENCED' DO NOTHING
-- to infer it.
CREATE UNIQUE INDEX rail_submission_one_forwarded_per_payout
    ON rail_submission (payout_id) WHERE outcome IS DISTINCT FROM 'FENCED';
CREATE INDEX rail_submission_payout_idx ON rail_submission (payout_id, id);
CREATE INDEX rail_submission_unresolved_idx ON rail_submission (id)
    WHERE (outcome IS NULL OR outcome = 'TIMEOUT') AND resolution IS NULL;
COMMENT ON TABLE rail_submission IS 'The proxy''s durable record of intent and outcome. Written before the rail is contacted; outcome written once, then resolution written once (D-6); identity columns immutable; never deleted. FENCED rows are inserted already FENCED and never forwarded (D-5).';
COMMENT ON COLUMN rail_submission.fence_token IS 'Token presented with the submission (the fenced-out token for a FENCED row).';
COMMENT ON COLUMN rail_submission.holder IS 'Session id of the presenting grant.';
COMMENT ON COLUMN rail_submission.client_ref IS 'Reference sent to the rail and used for ambiguity lookup (D-10).';
COMMENT ON COLUMN rail_submission.outcome IS 'NULL while unresolved (forwarded, no answer recorded yet), then exactly one of ACKED/REJECTED/TIMEOUT, written once. FENCED only at insert. NULL and TIMEOUT both mean "money may have moved".';
COMMENT ON COLUMN rail_submission.outcome_at IS 'When outcome was recorded; filled with now() if the writer leaves it NULL.';
COMMENT ON COLUMN rail_submission.resolution IS 'Ambiguity resolution from external evidence (SETTLED/ABSENT), written once; never edits outcome (D-6).';
COMMENT ON COLUMN rail_submission.resolution_evidence IS 'The evidence behind resolution (e.g. the rail lookup answer as JSON, or an operator note).';
COMMENT ON COLUMN rail_submission.resolution_at IS 'When resolution was recorded; filled with now() if the writer leaves it NULL.';

-- Write-once rules (D-6):
--   * identity columns never change;
--   * outcome goes NULL -> ACKED/REJECTED/TIMEOUT once; a non-NULL outcome never
--     changes; NULL -> FENCED is refused (it would take a forwarded row out of the
--     D-5 index and allow a second forwarded submission);
--   * rail_ref, error_code, outcome_at are frozen once outcome is set;
--   * resolution goes NULL -> SETTLED/ABSENT once; resolution_evidence and
--     resolution_at are frozen once resolution is set.
-- Raised with SQLSTATE 23001 (restrict_violation) and a CONSTRAINT name.
-- +goose StatementBegin
CREATE FUNCTION rail_submission_write_once() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'rail_submission % is never deleted', OLD.id
            USING ERRCODE = 'restrict_violation', CONSTRAINT = 'rail_submission_never_deleted', TABLE = 'rail_submission';
    END IF;

    IF TG_OP = 'UPDATE' THEN
        IF NEW.id IS DISTINCT FROM OLD.id
           OR NEW.payout_id IS DISTINCT FROM OLD.payout_id
           OR NEW.account_id IS DISTINCT FROM OLD.account_id
           OR NEW.fence_token IS DISTINCT FROM OLD.fence_token
           OR NEW.holder IS DISTINCT FROM OLD.holder
           OR NEW.client_ref IS DISTINCT FROM OLD.client_ref
           OR NEW.amount IS DISTINCT FROM OLD.amount
           OR NEW.currency IS DISTINCT FROM OLD.currency
           OR NEW.beneficiary_ref IS DISTINCT FROM OLD.beneficiary_ref
           OR NEW.created_at IS DISTINCT FROM OLD.created_at THEN
            RAISE EXCEPTION 'rail_submission %: only outcome and resolution may be written', OLD.id
                USING ERRCODE = 'restrict_violation', CONSTRAINT = 'rail_submission_identity_immutable', TABLE = 'rail_submission';
        END IF;

        IF OLD.outcome IS NOT NULL THEN
            IF NEW.outcome IS DISTINCT FROM OLD.outcome
               OR NEW.rail_ref IS DISTINCT FROM OLD.rail_ref
               OR NEW.error_code IS DISTINCT FROM OLD.error_code
               OR NEW.outcome_at IS DISTINCT FROM OLD.outcome_at THEN
                RAISE EXCEPTION 'rail_submission %: outcome already recorded as %', OLD.id, OLD.outcome
                    USING ERRCODE = 'restrict_violation', CONSTRAINT = 'rail_submission_outcome_write_once', TABLE = 'rail_submission', COLUMN = 'outcome';
            END IF;
        ELSIF NEW.outcome = 'FENCED' THEN
            RAISE EXCEPTION 'rail_submission %: a forwarded submission cannot become FENCED', OLD.id
                USING ERRCODE = 'restrict_violation', CONSTRAINT = 'rail_submission_outcome_write_once', TABLE = 'rail_submission', COLUMN = 'outcome';
        END IF;

        IF OLD.resolution IS NOT NULL THEN
            IF NEW.resolution IS DISTINCT FROM OLD.resolution
               OR NEW.resolution_evidence IS DISTINCT FROM OLD.resolution_evidence
               OR NEW.resolution_at IS DISTINCT FROM OLD.resolution_at THEN
                RAISE EXCEPTION 'rail_submission %: resolution already recorded as %', OLD.id, OLD.resolution
                    USING ERRCODE = 'restrict_violation', CONSTRAINT = 'rail_submission_resolution_write_once', TABLE = 'rail_submission', COLUMN = 'resolution';
            END IF;
        END IF;
    END IF;

    -- INSERT, or an UPDATE that passed the checks: stamp the write-once times.
    IF NEW.outcome IS NOT NULL AND NEW.outcome_at IS NULL THEN
        NEW.outcome_at := now();
    END IF;
    IF NEW.resolution IS NOT NULL AND NEW.resolution_at IS NULL THEN
        NEW.resolution_at := now();
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER rail_submission_write_once BEFORE INSERT OR UPDATE OR DELETE ON rail_submission
    FOR EACH ROW EXECUTE FUNCTION rail_submission_write_once();
CREATE TRIGGER rail_submission_no_truncate BEFORE TRUNCATE ON rail_submission
    FOR EACH STATEMENT EXECUTE FUNCTION truncate_refused();

CREATE TABLE safety_event (
    id              bigserial   PRIMARY KEY,
    kind            text        NOT NULL CHECK (kind IN ('fenced_out', 'duplicate_attempt', 'token_regression')),
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
COMMENT ON TABLE safety_event IS 'Evidence that a safety net fired at the proxy (fenced_out, duplicate_attempt, token_regression). Target: zero rows. Append-only.';
COMMENT ON COLUMN safety_event.key IS 'Lock key, payout:{account_id}.';

CREATE TRIGGER safety_event_append_only BEFORE UPDATE OR DELETE ON safety_event
    FOR EACH ROW EXECUTE FUNCTION append_only_violation();
CREATE TRIGGER safety_event_no_truncate BEFORE TRUNCATE ON safety_event
    FOR EACH STATEMENT EXECUTE FUNCTION truncate_refused();

-- +goose Down
DROP TABLE safety_event;
DROP TABLE rail_submission;
DROP TABLE account_high_water;
DROP FUNCTION rail_submission_write_once();
DROP FUNCTION account_high_water_never_deleted();
DROP FUNCTION truncate_refused();
DROP FUNCTION append_only_violation();
