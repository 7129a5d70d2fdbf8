-- lockdb: a grant log that does not grow forever. Ended grants older than
-- the lock service's --grant-retention (default 7 days) are deleted by the
-- service's compaction, and so are ended sessions no grant refers to any
-- more. Nothing else may delete a grant: the trigger refuses a DELETE unless
-- the grant has ended and the deleting transaction declared itself the
-- compaction (SET LOCAL payouts.compacting = 'on'). The newest grant is
-- always kept. The reconciler's window must stay within the retention.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION lock_grant_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF OLD.ended_at IS NOT NULL AND current_setting('payouts.compacting', true) = 'on' THEN
            RETURN OLD;
        END IF;
        RAISE EXCEPTION 'lock_grant % is never deleted (only ended grants, by the lock service''s retention compaction)', OLD.token
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

-- A release wakes waiting acquires (NOTIFY) only when one of them has
-- found the key held: NOTIFY serializes the commits of every transaction
-- that sends one, so an uncontended release must not send it.
ALTER TABLE lock_entry ADD COLUMN contended boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN lock_entry.contended IS 'A waiting acquire found this grant holding the key: its end sends a notification.';

-- Compaction finds ended grants by age, and sessions no grant refers to.
CREATE INDEX lock_grant_ended_idx ON lock_grant (ended_at) WHERE ended_at IS NOT NULL;
CREATE INDEX lock_grant_session_idx ON lock_grant (session_id);
DROP INDEX lock_grant_session_open_idx;
COMMENT ON TABLE lock_grant IS 'Every grant, written in the same transaction as the grant (D-9). Used by the reconciler (INV-07) and the linearizability check (INV-06). Ended grants older than the lock service''s grant retention are compacted away; nothing else deletes a grant.';

-- +goose Down
ALTER TABLE lock_entry DROP COLUMN contended;
CREATE INDEX lock_grant_session_open_idx ON lock_grant (session_id) WHERE ended_at IS NULL;
DROP INDEX lock_grant_session_idx;
DROP INDEX lock_grant_ended_idx;
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION lock_grant_guard() RETURNS trigger
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
