-- lockdb: failover detection and the grace period of D-12.
--
-- One row. identity is the database's system identifier, timeline and
-- postmaster start time as the lock service last saw them. When a lock
-- service process starts, or sees identity change (failover, restore,
-- crash restart), it moves grace_until to now() + the maximum TTL: until
-- then no session is expired, by the reaper or by an acquire taking over a
-- lapsed session's lock, because no client could heartbeat while the
-- database was away. Both timestamps come from the database's now().

-- +goose Up
CREATE TABLE lock_epoch (
    id          boolean     PRIMARY KEY DEFAULT true CHECK (id),
    identity    text        NOT NULL DEFAULT '',
    grace_until timestamptz NOT NULL DEFAULT '-infinity',
    updated_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO lock_epoch (id) VALUES (true);
COMMENT ON TABLE lock_epoch IS 'D-12: the database identity the lock service last saw and the end of the current grace period (no session expires before grace_until).';

-- The database's identity: system identifier and timeline when this role may
-- read them, and always the postmaster start time (a crash restart keeps the
-- timeline but not the start time).
-- +goose StatementBegin
CREATE FUNCTION lock_db_identity() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
             WHEN has_function_privilege('pg_control_system()', 'EXECUTE')
                  AND has_function_privilege('pg_control_checkpoint()', 'EXECUTE')
             THEN (SELECT system_identifier::text FROM pg_control_system()) || '/' ||
                  (SELECT timeline_id::text FROM pg_control_checkpoint())
             ELSE 'unprivileged'
           END || '/' || pg_postmaster_start_time()::text
$$;
-- +goose StatementEnd

-- The one definition of a live session (D-11, D-12): ACTIVE and not past its
-- expiry by the database's now(), or anything ACTIVE while a grace period
-- runs or the database's identity changed and no lock service has noticed yet.
-- +goose StatementBegin
CREATE FUNCTION lock_session_live(state text, expires_at timestamptz) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT state = 'ACTIVE'
       AND (expires_at > now()
            OR EXISTS (SELECT 1 FROM lock_epoch
                        WHERE now() < grace_until OR identity IS DISTINCT FROM lock_db_identity()))
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION lock_session_live(text, timestamptz);
DROP FUNCTION lock_db_identity();
DROP TABLE lock_epoch;
