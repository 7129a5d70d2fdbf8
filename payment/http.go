package payment

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/wire"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// Who may call which fenced mutation. The operator may do what the executor
// does (development stacks run every caller as operator; break-glass).
var opRoles = map[Op][]auth.Role{
	OpClaim:      {auth.Executor, auth.Operator},
	OpSubmitting: {auth.Executor, auth.Operator},
	OpOutcome:    {auth.Executor, auth.Operator},
	OpPost:       {auth.Executor, auth.Operator},
	OpResolve:    {auth.Reconciler, auth.Operator},
	OpCancel:     {auth.Operator},
	OpAbandon:    {auth.Operator},
	OpRefuse:     {auth.Executor, auth.Operator},
}

// Mount adds the payment resource's routes (under /v1) to an authenticated router.
func (s *Service) Mount(r chi.Router) {
	r.Route("/v1", func(r chi.Router) {
		r.With(auth.Require(auth.Operator)).Post("/accounts", httpx.Handler(s.handleCreateAccount))
		r.With(auth.Require(auth.Operator)).Post("/payouts", httpx.Handler(s.handleCreatePayout))
		for _, op := range Ops {
			r.With(auth.Require(opRoles[op]...)).Post("/payouts/{id}/"+string(op), httpx.Handler(s.handleMutation(op)))
		}
		// One step for several payouts of one account: the roles of the
		// single steps it batches (claim, submitting, outcome, post).
		r.With(auth.Require(opRoles[OpClaim]...)).Post("/accounts/{id}/steps", httpx.Handler(s.handleSteps))
		r.Group(func(r chi.Router) {
			// Every caller role reads; the proxy role is a credential at the
			// rail only.
			r.Use(auth.Require(auth.Callers...))
			r.Get("/accounts", httpx.Handler(s.handleListAccounts))
			r.Get("/accounts/{id}", httpx.Handler(readByID("account", s.Account)))
			r.Get("/accounts/{id}/ledger-sum", httpx.Handler(readByID("account", s.LedgerSum)))
			r.Get("/payouts", httpx.Handler(s.handleListPayouts))
			r.Get("/payouts/{id}", httpx.Handler(readByID("payout", s.Payout)))
			r.Get("/payouts/{id}/events", httpx.Handler(s.handlePayoutEvents))
			r.Get("/payout-digests", httpx.Handler(s.handlePayoutDigests))
			r.Get("/work", httpx.Handler(s.handleWork))
			// The ledger is read whole by the reconciler: it takes bulk pages.
			r.Get("/ledger", httpx.PagedByID(wire.ParseBulkLimit, s.Ledger, func(e pc.LedgerEntry) int64 { return e.ID }))
			r.Get("/safety-events", httpx.PagedByID(wire.ParseLimit, s.SafetyEvents, func(e pc.SafetyEvent) int64 { return e.ID }))
			r.Get("/terminal-exits", httpx.PagedByID(wire.ParseLimit, s.TerminalExits, func(e pc.PayoutEvent) int64 { return e.ID }))
			r.Get("/fences/high", httpx.Handler(s.handleHighFence))
		})
	})
}

func actor(r *http.Request) string {
	p, ok := auth.FromContext(r.Context())
	if !ok {
		return "unknown"
	}
	return string(p.Role) + ":" + p.Name
}

// readByID is a read of one object by the {id} of its path (what: its
// kind), which takes no query parameter, answered as JSON.
func readByID[T any](what string, read func(context.Context, string) (T, error)) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		if _, err := wire.Query(r.URL.RawQuery); err != nil {
			return err
		}
		id, err := pathID(r, what)
		if err != nil {
			return err
		}
		v, err := read(r.Context(), id)
		if err != nil {
			return err
		}
		httpx.WriteJSON(w, http.StatusOK, v)
		return nil
	}
}

// pathID reads an id from the path; an id that cannot exist is not found.
func pathID(r *http.Request, what string) (string, error) {
	id := httpx.PathParam(r, "id")
	if !wire.IDPattern.MatchString(id) {
		return "", problem.New(problem.NotFound, "no %s %q", what, id)
	}
	return id, nil
}

// statesParam reads ?state=: one state, or several separated by commas.
func statesParam(v string) ([]pc.State, error) {
	if v == "" {
		return nil, nil
	}
	var out []pc.State
	for _, part := range strings.Split(v, ",") {
		st := pc.State(part)
		if !st.Valid() {
			return nil, badField("state", "must be PENDING, CLAIMED, RAIL_SUBMITTED, RAIL_ACKED, RAIL_AMBIGUOUS, POSTED, FAILED or ABANDONED, or several of them separated by commas; got %q", part)
		}
		if !slices.Contains(out, st) {
			out = append(out, st)
		}
	}
	return out, nil
}

func writeList[T any](w http.ResponseWriter, items []T, limit int, cursor func(T) string) {
	httpx.WriteJSON(w, http.StatusOK, wire.NewPage(items, limit, cursor))
}

func idOf(id int64) string { return strconv.FormatInt(id, 10) }

func (s *Service) handleCreateAccount(w http.ResponseWriter, r *http.Request) error {
	req, err := decodeCreateAccount(r, s.currency)
	if err != nil {
		return err
	}
	a, created, err := s.CreateAccount(r.Context(), req)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
		httpx.Log(r.Context()).Info("account created", "account_id", a.ID, "opening_balance", req.OpeningBalance, "actor", actor(r))
	}
	httpx.WriteJSON(w, status, a)
	return nil
}

func (s *Service) handleListAccounts(w http.ResponseWriter, r *http.Request) error {
	q, err := wire.Query(r.URL.RawQuery, "after", "limit")
	if err != nil {
		return err
	}
	limit, err := wire.ParseLimit(q)
	if err != nil {
		return err
	}
	after, err := wire.ParseKeyCursor(q)
	if err != nil {
		return err
	}
	items, err := s.Accounts(r.Context(), after, limit)
	if err != nil {
		return err
	}
	writeList(w, items, limit, func(a pc.Account) string { return a.ID })
	return nil
}

func (s *Service) handleCreatePayout(w http.ResponseWriter, r *http.Request) error {
	req, err := decodeCreatePayout(r, s.currency)
	if err != nil {
		return err
	}
	p, created, err := s.CreatePayout(r.Context(), req, actor(r))
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	httpx.WriteJSON(w, status, p)
	return nil
}

func (s *Service) handleListPayouts(w http.ResponseWriter, r *http.Request) error {
	q, err := wire.Query(r.URL.RawQuery, "after", "limit", "state", "account_id")
	if err != nil {
		return err
	}
	limit, err := wire.ParseLimit(q)
	if err != nil {
		return err
	}
	after, err := wire.ParseKeyCursor(q)
	if err != nil {
		return err
	}
	states, err := statesParam(q.Get("state"))
	if err != nil {
		return err
	}
	account := q.Get("account_id")
	if account != "" && !wire.IDPattern.MatchString(account) {
		return badField("account_id", "is not an account id: %q", account)
	}
	items, err := s.Payouts(r.Context(), states, account, after, limit)
	if err != nil {
		return err
	}
	writeList(w, items, limit, func(p pc.Payout) string { return p.ID })
	return nil
}

func (s *Service) handlePayoutEvents(w http.ResponseWriter, r *http.Request) error {
	q, err := wire.Query(r.URL.RawQuery, "after", "limit")
	if err != nil {
		return err
	}
	id, err := pathID(r, "payout")
	if err != nil {
		return err
	}
	limit, err := wire.ParseLimit(q)
	if err != nil {
		return err
	}
	after, err := wire.ParseIDCursor(q)
	if err != nil {
		return err
	}
	items, err := s.PayoutEvents(r.Context(), id, after, limit)
	if err != nil {
		return err
	}
	writeList(w, items, limit, func(e pc.PayoutEvent) string { return idOf(e.ID) })
	return nil
}

func (s *Service) handleMutation(op Op) func(w http.ResponseWriter, r *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		id, err := pathID(r, "payout")
		if err != nil {
			return err
		}
		cmd, err := decodeCommand(r, op)
		if err != nil {
			return err
		}
		cmd.Actor = actor(r)
		p, err := s.Apply(r.Context(), id, cmd)
		if err != nil {
			return err
		}
		httpx.WriteJSON(w, http.StatusOK, p)
		return nil
	}
}

func (s *Service) handleWork(w http.ResponseWriter, r *http.Request) error {
	// skip is the one parameter given once per account it names.
	q, err := wire.QueryRepeatable(r.URL.RawQuery, []string{"skip"}, "limit", "wait_ms", "payouts")
	if err != nil {
		return err
	}
	limit, err := wire.ParseLimit(q)
	if err != nil {
		return err
	}
	skip := q["skip"]
	if len(skip) > pc.MaxWorkSkip {
		return badField("skip", "at most %d accounts, got %d", pc.MaxWorkSkip, len(skip))
	}
	for _, a := range skip {
		if !wire.IDPattern.MatchString(a) {
			return badField("skip", "is not an account id: %q", a)
		}
	}
	wait, err := waitParam(q)
	if err != nil {
		return err
	}
	payouts, err := payoutsParam(q)
	if err != nil {
		return err
	}
	items, err := s.WaitForWork(r.Context(), limit, skip, payouts, wait)
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, pc.List[pc.WorkItem]{Items: items})
	return nil
}

func (s *Service) handleHighFence(w http.ResponseWriter, r *http.Request) error {
	if _, err := wire.Query(r.URL.RawQuery); err != nil {
		return err
	}
	t, err := s.HighFence(r.Context())
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, pc.HighFence{Token: t})
	return nil
}
