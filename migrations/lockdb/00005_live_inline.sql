-- lockdb: a cheap definition of a live session.
--
-- lock_session_live keeps its meaning (D-11, D-12): ACTIVE and not past its
-- expiry by the database's now(), or anything ACTIVE while a grace period
-- runs or the database's identity changed and no lock service has noticed
-- yet. Before, its body held a sublink, so PostgreSQL could not inline it:
-- every call site of every statement planned and ran the body in the SQL
-- function executor (about 0.1 ms each, several per acquire). Now the grace
-- test is a function of its own, lock_in_grace(), and lock_session_live is a
-- plain expression the planner inlines into the calling statement, where
-- the session's columns are compared by index. lock_in_grace() runs only for
-- a session already past its expiry (OR is evaluated left to right), which a
-- hot-path statement meets only when it takes over a lapsed lock.

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

-- +goose Down
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
