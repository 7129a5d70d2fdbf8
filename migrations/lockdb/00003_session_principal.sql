-- lockdb: a session belongs to the authenticated principal that opened it
-- (the auth token's name). Acquire, keepalive, release and close by another
-- principal are refused (403 not_session_owner); an operator ends another
-- principal's lock only by revoke. Sessions opened before this migration
-- have principal '' and are not tied to anyone; they end within one
-- maximum TTL (5 minutes) unless renewed.

-- +goose Up
ALTER TABLE lock_session ADD COLUMN principal text NOT NULL DEFAULT '';
COMMENT ON COLUMN lock_session.principal IS 'The authenticated principal (auth token name) that owns the session; immutable. Empty for sessions opened before ownership was recorded.';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION lock_session_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.id IS DISTINCT FROM OLD.id
       OR NEW.owner IS DISTINCT FROM OLD.owner
       OR NEW.principal IS DISTINCT FROM OLD.principal
       OR NEW.created_at IS DISTINCT FROM OLD.created_at THEN
        RAISE EXCEPTION 'lock_session %: id, owner, principal and created_at are immutable', OLD.id
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

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION lock_session_guard() RETURNS trigger
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
ALTER TABLE lock_session DROP COLUMN principal;
