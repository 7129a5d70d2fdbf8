-- lockdb: the PostgreSQL backend of the lock service. See DESIGN.md §3 and
-- D-2, D-9, D-11, D-12, D-13.
--
-- Tokens come from one sequence that never cycles and is never reset (INV-04);
-- only `payouts lock bump-tokens` moves it, and only upwards (D-13). Every grant is logged in
-- lock_grant in the same transaction as the lock_entry it creates (D-9).
-- Session liveness and the grace period (lock_session_live, lock_epoch;
-- D-11, D-12) are in 00002_grace.sql.

-- +goose Up

-- D-2: positive, strictly increasing, never reused. MAXVALUE keeps tokens exact
-- as JSON numbers (2^53 - 1): the sequence errors rather than issue a token a
-- JSON client would round.
CREATE SEQUENCE lock_token_seq AS bigint
    MINVALUE 1 MAXVALUE 9007199254740991 START 1 NO CYCLE;
COMMENT ON SEQUENCE lock_token_seq IS 'The only source of fencing tokens (D-2). NO CYCLE; never reset, never setval downwards. After a restore, raise it with payouts lock bump-tokens (D-13).';

CREATE TABLE lock_session (
    id                text        PRIMARY KEY DEFAULT gen_random_uuid()::text CHECK (id <> ''),
    owner             text        NOT NULL CHECK (owner <> ''),
    ttl_ms            integer     NOT NULL CHECK (ttl_ms BETWEEN 1000 AND 300000),
    created_at        timestamptz NOT NULL DEFAULT now(),
    last_heartbeat_at timestamptz NOT NULL DEFAULT now(),
    expires_at        timestamptz NOT NULL,
    state             text        NOT NULL DEFAULT 'ACTIVE' CHECK (state IN ('ACTIVE', 'EXPIRED', 'CLOSED'))
);
CREATE INDEX lock_session_active_expiry_idx ON lock_session (expires_at) WHERE state = 'ACTIVE';
COMMENT ON TABLE lock_session IS 'A client''s liveness relationship; its locks die with it. ACTIVE until closed (CLOSED) or expired by the backend (EXPIRED); both are final. SUSPECT is computed, not stored.';
COMMENT ON COLUMN lock_session.id IS 'Session id; also the grant''s holder identity presented to the guards (D-1).';
COMMENT ON COLUMN lock_session.expires_at IS 'Server-side expiry, computed from the database''s now() inside the statement, never the lock server''s clock (D-11).';

-- +goose StatementBegin
CREATE FUNCTION lock_session_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.id IS DISTINCT FROM OLD.id
       OR NEW.owner IS DISTINCT FROM OLD.owner
       OR NEW.created_at IS DISTINCT FROM OLD.created_at THEN
        RAISE EXCEPTION 'lock_session %: id, owner and created_at are immutable', OLD.id
            USING ERRCODE = 'restrict_violation', CONSTRAINT = 'lock_session_identity_immutable', TABLE = 'lock_session';
    END IF;
    IF OLD.state <> 'ACTIVE' AND NEW.state IS DISTINCT FROM OLD.state THEN
        RAISE EXCEPTION 'lock_session % is % and cannot become %', OLD.id, OLD.state, NEW.state
            USING ERRCODE = 'restrict_violation', CONSTRAINT = 'lock_session_state_final', TABLE = 'lock_session', COLUMN = 'state';
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER lock_session_guard BEFORE UPDATE ON lock_session
    FOR EACH ROW EXECUTE FUNCTION lock_session_guard();

CREATE TABLE lock_grant (
    token      bigint      PRIMARY KEY CHECK (token > 0),
    key        text        NOT NULL CHECK (key <> ''),
    owner      text        NOT NULL,
    session_id text        NOT NULL REFERENCES lock_session (id),
    granted_at timestamptz NOT NULL DEFAULT now(),
    ended_at   timestamptz,
    end_reason text        CHECK (end_reason IN ('released', 'expired', 'revoked')),
    actor      text,
    reason     text,
    CONSTRAINT lock_grant_ended CHECK ((ended_at IS NULL) = (end_reason IS NULL)),
    CONSTRAINT lock_grant_key_token_key UNIQUE (key, token)
);
CREATE INDEX lock_grant_session_open_idx ON lock_grant (session_id) WHERE ended_at IS NULL;
COMMENT ON TABLE lock_grant IS 'Every grant ever made, written in the same transaction as the grant (D-9). Used by the reconciler (INV-07) and the linearizability check (INV-06). Never deleted.';
COMMENT ON COLUMN lock_grant.token IS 'The fencing token minted for the grant (nextval of lock_token_seq).';
COMMENT ON COLUMN lock_grant.end_reason IS 'How the grant ended: released, expired, revoked; NULL while held. Written once, with ended_at.';
COMMENT ON COLUMN lock_grant.actor IS 'Who ended the grant (the holder, the backend, or the revoking operator).';
COMMENT ON COLUMN lock_grant.reason IS 'Operator''s reason for a revoke.';

-- +goose StatementBegin
CREATE FUNCTION lock_grant_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'lock_grant % is never deleted', OLD.token
            USING ERRCODE = 'restrict_violation', CONSTRAINT = 'lock_grant_never_deleted', TABLE = 'lock_grant';
    END IF;
    IF NEW.token IS DISTINCT FROM OLD.token
       OR NEW.key IS DISTINCT FROM OLD.key
       OR NEW.owner IS DISTINCT FROM OLD.owner
       OR NEW.session_id IS DISTINCT FROM OLD.session_id
       OR NEW.granted_at IS DISTINCT FROM OLD.granted_at THEN
        RAISE EXCEPTION 'lock_grant %: token, key, owner, session_id and granted_at are immutable', OLD.token
            USING ERRCODE = 'restrict_violation', CONSTRAINT = 'lock_grant_identity_immutable', TABLE = 'lock_grant';
    END IF;
    IF OLD.ended_at IS NOT NULL
       AND (NEW.ended_at IS DISTINCT FROM OLD.ended_at
            OR NEW.end_reason IS DISTINCT FROM OLD.end_reason
            OR NEW.actor IS DISTINCT FROM OLD.actor
            OR NEW.reason IS DISTINCT FROM OLD.reason) THEN
        RAISE EXCEPTION 'lock_grant % already ended (%)', OLD.token, OLD.end_reason
            USING ERRCODE = 'restrict_violation', CONSTRAINT = 'lock_grant_end_write_once', TABLE = 'lock_grant';
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER lock_grant_guard BEFORE UPDATE OR DELETE ON lock_grant
    FOR EACH ROW EXECUTE FUNCTION lock_grant_guard();

-- +goose StatementBegin
CREATE FUNCTION lock_grant_no_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'TRUNCATE lock_grant refused: grants are never deleted'
        USING ERRCODE = 'restrict_violation', CONSTRAINT = 'lock_grant_no_truncate', TABLE = 'lock_grant';
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER lock_grant_no_truncate BEFORE TRUNCATE ON lock_grant
    FOR EACH STATEMENT EXECUTE FUNCTION lock_grant_no_truncate();

CREATE TABLE lock_entry (
    key         text        PRIMARY KEY CHECK (key <> ''),
    owner       text        NOT NULL,
    session_id  text        NOT NULL REFERENCES lock_session (id),
    token       bigint      NOT NULL CHECK (token > 0),
    acquired_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT lock_entry_token_key UNIQUE (token),
    -- D-9: a held lock always has its grant record, for the same key. Deferred,
    -- so the grant and the entry may be inserted in either order.
    CONSTRAINT lock_entry_grant_fkey FOREIGN KEY (key, token)
        REFERENCES lock_grant (key, token) DEFERRABLE INITIALLY DEFERRED
);
CREATE INDEX lock_entry_session_idx ON lock_entry (session_id);
COMMENT ON TABLE lock_entry IS 'One held lock; exists only while held (the token sequence outlives it). Introspection of this table is never a correctness input.';
COMMENT ON COLUMN lock_entry.token IS 'Fencing token of the current grant; an idempotent re-acquire by the same owner and session returns it unchanged (D-2).';

-- +goose Down
DROP TABLE lock_entry;
DROP TABLE lock_grant;
DROP TABLE lock_session;
DROP FUNCTION lock_grant_no_truncate();
DROP FUNCTION lock_grant_guard();
DROP FUNCTION lock_session_guard();
DROP SEQUENCE lock_token_seq;
