-- +goose Up
-- lockdb: the database's identity no longer depends on who asks, or how.
--
-- lock_db_identity() (D-12) rendered the postmaster start time as text in
-- the connection's TimeZone and DateStyle, and read the system identifier
-- and timeline only when the connecting role could: two lock services with
-- different settings or roles on one lockdb computed different identities,
-- each saw the other's as a change, and the grace period never ended (no
-- session expired, no lapsed lock was taken over). Now the start time is
-- its epoch, and the function runs with its owner's privileges, the same
-- for every caller. The first lock service to run after this migration
-- sees the new spelling as a changed identity once: one grace period.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION lock_db_identity() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT CASE
             WHEN has_function_privilege('pg_control_system()', 'EXECUTE')
                  AND has_function_privilege('pg_control_checkpoint()', 'EXECUTE')
             THEN (SELECT system_identifier::text FROM pg_control_system()) || '/' ||
                  (SELECT timeline_id::text FROM pg_control_checkpoint())
             ELSE 'unprivileged'
           END || '/' || extract(epoch FROM pg_postmaster_start_time())::text
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION lock_db_identity() RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER AS $$
    SELECT CASE
             WHEN has_function_privilege('pg_control_system()', 'EXECUTE')
                  AND has_function_privilege('pg_control_checkpoint()', 'EXECUTE')
             THEN (SELECT system_identifier::text FROM pg_control_system()) || '/' ||
                  (SELECT timeline_id::text FROM pg_control_checkpoint())
             ELSE 'unprivileged'
           END || '/' || pg_postmaster_start_time()::text
$$;
-- +goose StatementEnd
