-- lockdb: a cheap definition of a live session.
--
-- lock_session_live keeps its meaning (D-11, D-12): ACTIVE and not past its
-- expiry by the database's now(), or anything ACTIVE while a grace period
-- runs or the database's identity changed and no lock service has noticed
-- yet. Before, its body held a sublink, so PostgreSQL could not inline it:
-- every call site of every statement planned and ran the body in the SQL
-- function executor (about 0.1 ms each, several per acquire). Now the grace
-- test is a function of its own, lock_in_grace(), and lock_session_live is a
-- plain expression the planner inlines into the calling statement, which
-- then finds the session row by its primary key. lock_in_grace() runs only for
-- a session already past its expiry (OR is evaluated left to right), which a
-- hot-path statement meets only when it takes over a lapsed lock.
--
-- Inlined, the liveness test shows the planner `state = 'ACTIVE'`, which
-- matched the partial index the reaper uses: with statistics taken while
-- few sessions were active, an acquire looking one session up by id was
-- planned as a scan of every active session. The reaper's index now also
-- names ttl_ms > 0 (always true, by the CHECK on ttl_ms), which only the
-- reaper's own statements say, so a statement that looks a session up by id
-- can only use the primary key.
--
-- The write set of a grant shrinks too:
-- - lock_entry_token_key goes: a token is unique by construction (the
--   entry's (key, token) must match its grant, whose token is the primary
--   key, and the key is lock_entry's primary key), and the index was a
--   right-most-leaf hot spot written by every acquire.
-- - The foreign keys from lock_entry and lock_grant to lock_session go (each
--   ran a check query on every acquire). What they protected holds without
--   them: an acquire writes both rows only for the session it has just read
--   live and locked FOR SHARE in the same statement, and the only statement
--   that deletes sessions (the lock service's compaction) deletes ended
--   sessions that no grant or entry refers to, checked in that statement.
--   lock_entry's foreign key to its grant (D-9) stays.
-- - A release ends its grant in place: ended_at is no longer indexed
--   (compaction finds old grants through granted_at, which never changes
--   and bounds ended_at from below), and lock_grant leaves room on each page,
--   so the update is HOT (no index entry written) instead of writing a new
--   entry in every index of lock_grant.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION lock_in_grace() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM lock_epoch
                    WHERE now() < grace_until OR identity IS DISTINCT FROM lock_db_identity())
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION lock_in_grace() IS 'D-12: true while no session may expire (a grace period runs, or the database identity changed and no lock service has noticed yet).';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION lock_session_live(state text, expires_at timestamptz) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT state = 'ACTIVE' AND (expires_at > now() OR lock_in_grace())
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION lock_session_live(text, timestamptz) IS 'The one definition of a live session (D-11, D-12). Inlined by the planner: keep its body a single expression without subqueries.';

DROP INDEX lock_session_active_expiry_idx;
CREATE INDEX lock_session_active_expiry_idx ON lock_session (expires_at) WHERE state = 'ACTIVE' AND ttl_ms > 0;
COMMENT ON INDEX lock_session_active_expiry_idx IS 'The reaper''s: statements using it say state = ''ACTIVE'' AND ttl_ms > 0. Hot-path statements look sessions up by id and must not match this predicate.';
ALTER TABLE lock_entry DROP CONSTRAINT lock_entry_token_key, DROP CONSTRAINT lock_entry_session_id_fkey;
ALTER TABLE lock_grant DROP CONSTRAINT lock_grant_session_id_fkey;
CREATE INDEX lock_grant_granted_idx ON lock_grant (granted_at);
DROP INDEX lock_grant_ended_idx;
ALTER TABLE lock_grant SET (fillfactor = 70);

-- +goose Down
DROP INDEX lock_session_active_expiry_idx;
CREATE INDEX lock_session_active_expiry_idx ON lock_session (expires_at) WHERE state = 'ACTIVE';
ALTER TABLE lock_grant RESET (fillfactor);
CREATE INDEX lock_grant_ended_idx ON lock_grant (ended_at) WHERE ended_at IS NOT NULL;
DROP INDEX lock_grant_granted_idx;
ALTER TABLE lock_grant ADD CONSTRAINT lock_grant_session_id_fkey FOREIGN KEY (session_id) REFERENCES lock_session (id);
ALTER TABLE lock_entry ADD CONSTRAINT lock_entry_token_key UNIQUE (token),
    ADD CONSTRAINT lock_entry_session_id_fkey FOREIGN KEY (session_id) REFERENCES lock_session (id);
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION lock_session_live(state text, expires_at timestamptz) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT state = 'ACTIVE'
       AND (expires_at > now()
            OR EXISTS (SELECT 1 FROM lock_epoch
                        WHERE now() < grace_until OR identity IS DISTINCT FROM lock_db_identity()))
$$;
-- +goose StatementEnd
DROP FUNCTION lock_in_grace();
