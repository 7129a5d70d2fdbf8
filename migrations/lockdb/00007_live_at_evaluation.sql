-- lockdb: a session is live or not by the database's clock when that is
-- asked, not when the asking transaction began.
--
-- lock_session_live and lock_in_grace (D-11, D-12) compared the session's
-- expiry and the grace period with now(), the start of the transaction.
-- An acquire runs as one implicit transaction that waits for its keys'
-- advisory locks (another acquire of a key) before its statement decides;
-- a release can wait for its lock's row while another transaction changes
-- it (a waiting acquire marking it contended), then decide again on the
-- changed row. A session whose lease ended during such a wait was judged
-- live: an acquire granted it a fresh token (its grant logged after its
-- expiry), a release of its lock was logged released instead of expired.
-- Both now compare with clock_timestamp(), the time the test is evaluated:
-- still the database's clock, never the lock server's. Expiry itself is
-- still set from now() (a keepalive: now() + the TTL).
--
-- Both are declared VOLATILE, as their bodies now are. The planner inlines
-- a SQL function only if its body is no more volatile than its declaration:
-- a STABLE lock_session_live calling clock_timestamp() would run in the
-- SQL function executor at every call (see 00005). Declared VOLATILE it is
-- still inlined, and the calling statement still finds the session by its
-- primary key; the volatile test is a filter on that one row. The release
-- asks with an EXISTS, which PostgreSQL no longer turns into a join (it
-- never does with a volatile condition): a subplan per released lock, one
-- lookup by primary key each, as the join was. No index or constraint uses
-- either function (a volatile one could not be).
--
-- Within a statement clock_timestamp() only moves forward, so a session
-- found lapsed stays lapsed when a later part of the statement asks again
-- (the acquire's takeover re-checks its holder on the row it updates). A
-- statement that waited for a row another transaction changed re-checks
-- its conditions on the new row, and with them the clock. lock_in_grace()
-- reads lock_epoch with a snapshot of its own, as any query in a VOLATILE
-- function does: a grace period is seen as soon as it has committed.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION lock_in_grace() RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT EXISTS (SELECT 1 FROM lock_epoch
                    WHERE clock_timestamp() < grace_until OR identity IS DISTINCT FROM lock_db_identity())
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION lock_session_live(state text, expires_at timestamptz) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT state = 'ACTIVE' AND (expires_at > clock_timestamp() OR lock_in_grace())
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION lock_session_live(text, timestamptz) IS 'The one definition of a live session (D-11, D-12), by the database''s clock when it is evaluated (clock_timestamp()). Inlined by the planner: keep its body a single expression without subqueries, and the function VOLATILE (a STABLE one calling clock_timestamp() is not inlined).';

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION lock_session_live(state text, expires_at timestamptz) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT state = 'ACTIVE' AND (expires_at > now() OR lock_in_grace())
$$;
-- +goose StatementEnd
COMMENT ON FUNCTION lock_session_live(text, timestamptz) IS 'The one definition of a live session (D-11, D-12). Inlined by the planner: keep its body a single expression without subqueries.';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION lock_in_grace() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM lock_epoch
                    WHERE now() < grace_until OR identity IS DISTINCT FROM lock_db_identity())
$$;
-- +goose StatementEnd
