package railproxy

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/pgpool"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/wire"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// maxBatchForwards bounds the rail calls one batch submission has in flight.
const maxBatchForwards = 16

// writeIntents runs a submission's one transaction in two round trips:
// BEGIN, guard 2 (the same statement for a single submission and a batch)
// and every item's intent row (intentSQL, one statement for them all) in
// one pipelined batch, then COMMIT or ROLLBACK. The intents ride behind the
// guard in its round trip and are kept only if the guard accepted the
// token: fenced (the guard refused it) rolls everything back — the intents
// with the rest, nothing is forwarded — and m is the mark that refused it.
// Otherwise res[i] is intentWritten (recs[i] the intent) or intentExists
// (the payout already has a forwarded submission, or is listed earlier in
// reqs: nothing written for it). When no intent is written the transaction
// is rolled back, the high-water mark included.
func (st *store) writeIntents(ctx context.Context, reqs []proxyclient.SubmitRequest) (recs []proxyclient.Record, res []intentResult, m mark, fenced bool, err error) {
	tx, err := pgpool.Begin(ctx, st.pool)
	if err != nil {
		return nil, nil, m, false, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit

	first := reqs[0]
	b := &pgx.Batch{}
	queueGuard(b, first.AccountID, first.Token, first.Holder)
	b.Queue(intentSQL+recordCols, st.intentArgs(reqs)...)
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	m, accepted, err := scanGuard(br.QueryRow())
	if err != nil || !accepted {
		return nil, nil, m, err == nil, err
	}
	rows, err := br.Query()
	if err != nil {
		return nil, nil, m, false, fmt.Errorf("insert %d intents: %w", len(reqs), err)
	}
	inserted, err := collectRecords(rows)
	if err != nil {
		return nil, nil, m, false, fmt.Errorf("insert %d intents: %w", len(reqs), err)
	}
	if err := br.Close(); err != nil {
		return nil, nil, m, false, fmt.Errorf("insert %d intents: %w", len(reqs), err)
	}
	byPayout := make(map[string]proxyclient.Record, len(inserted))
	for _, r := range inserted {
		byPayout[r.PayoutID] = r
	}
	recs, res = make([]proxyclient.Record, len(reqs)), make([]intentResult, len(reqs))
	for i, req := range reqs {
		r, ok := byPayout[req.PayoutID]
		if !ok {
			res[i] = intentExists
			continue
		}
		delete(byPayout, req.PayoutID)
		recs[i], res[i] = r, intentWritten
	}
	if len(inserted) == 0 {
		return recs, res, m, false, nil
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, nil, m, false, fmt.Errorf("commit intents: %w", err)
	}
	return recs, res, m, false, nil
}

// checkFence runs guard 2 alone, for a submission that will not be written
// because the rail is paused (pause.go): fenced reports that the guard
// refused the token, and m is the mark that refused it. The transaction is
// rolled back either way: nothing is written, the high-water mark
// included, as when a submission writes no intent.
func (st *store) checkFence(ctx context.Context, req proxyclient.SubmitRequest) (m mark, fenced bool, err error) {
	tx, err := pgpool.Begin(ctx, st.pool)
	if err != nil {
		return m, false, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // nothing to keep
	b := &pgx.Batch{}
	queueGuard(b, req.AccountID, req.Token, req.Holder)
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	m, accepted, err := scanGuard(br.QueryRow())
	return m, err == nil && !accepted, err
}

// batchRequests validates a batch submission of account and returns its
// items as single submissions.
func batchRequests(account string, req proxyclient.BatchSubmitRequest) ([]proxyclient.SubmitRequest, error) {
	if err := wire.ValidFence(req.Token, req.Holder); err != nil {
		return nil, err
	}
	if len(req.Items) == 0 || len(req.Items) > proxyclient.MaxBatchItems {
		return nil, wire.BadField("items", "between 1 and %d payouts, got %d", proxyclient.MaxBatchItems, len(req.Items))
	}
	out := make([]proxyclient.SubmitRequest, len(req.Items))
	seen := make(map[string]bool, len(req.Items))
	for i, it := range req.Items {
		out[i] = proxyclient.SubmitRequest{
			PayoutID: it.PayoutID, AccountID: account, Token: req.Token, Holder: req.Holder,
			ClientRef: it.ClientRef, Amount: it.Amount, Currency: it.Currency, BeneficiaryRef: it.BeneficiaryRef,
		}
		if err := validateSubmit(out[i]); err != nil {
			e := problem.From(err)
			var field string
			e.Extension("field", &field)
			return nil, wire.BadField(fmt.Sprintf("items[%d].%s", i, field), "%s", strings.TrimPrefix(e.Message, field+": "))
		}
		if seen[it.PayoutID] {
			return nil, wire.BadField(fmt.Sprintf("items[%d].payout_id", i), "payout %q is listed twice", it.PayoutID)
		}
		seen[it.PayoutID] = true
	}
	return out, nil
}

// batchItemError is an item of a batch answer that was not forwarded, or
// whose outcome could not be recorded.
type batchItemError struct {
	PayoutID string         `json:"payout_id"`
	Error    *problem.Error `json:"error"`
}

type batchAnswer struct {
	Items []any `json:"items"`
}

// submitBatch serves POST /v1/accounts/{id}/submissions: one transaction
// for the guard and every intent, then each written intent forwarded as a
// single submission's is (forward), detached from the caller, at most
// maxBatchForwards at once; the answer comes when all are done.
func (s *Server) submitBatch(w http.ResponseWriter, r *http.Request) error {
	account := httpx.PathParam(r, "id")
	if err := wire.ValidID("account_id", account); err != nil {
		return refusedUnforwarded(err, "")
	}
	var body proxyclient.BatchSubmitRequest
	if err := httpx.DecodeJSON(r, &body); err != nil {
		return refusedUnforwarded(err, "")
	}
	reqs, err := batchRequests(account, body)
	if err != nil {
		httpx.Log(r.Context()).Warn("batch submission refused without forwarding: it can never be accepted",
			obs.KeyAccountID, account, obs.KeyError, err.Error())
		return refusedUnforwarded(err, "")
	}
	log := httpx.Log(r.Context()).With(obs.KeyAccountID, account, obs.KeyKey, fencing.Key(account),
		obs.KeyToken, int64(body.Token), obs.KeyHolder, string(body.Holder))

	// As for a single submission: from here on the caller going away
	// changes nothing.
	detached := context.WithoutCancel(r.Context())
	if !s.enter() {
		return shuttingDown()
	}
	defer s.forwards.Done()
	// While the rail is paused, the items past those admitted (none, or
	// one: the probe) are answered without being written or forwarded.
	admitted := s.gate.Admit(s.now(), len(reqs))
	if admitted == 0 {
		return s.paused(detached, w, log.With("items", len(reqs)), reqs)
	}
	held := reqs[admitted:]
	reqs = reqs[:admitted]
	begun := time.Now()
	ctx, cancel := context.WithTimeout(detached, dbTimeout)
	recs, res, hw, fenced, err := s.st.writeIntents(ctx, reqs)
	cancel()
	if err != nil {
		return problem.Wrap(problem.Unavailable, err, "the batch submission could not be recorded; none of it was forwarded")
	}
	if fenced {
		if hook := s.afterRefusal.Load(); hook != nil {
			(*hook)()
		}
		// One refusal, one event, for the first item's payout; a FENCED row
		// for each item, held ones included (the same token sent them),
		// the evidence that a stale holder tried to send it.
		return s.fencedOut(detached, log.With(obs.KeyPayoutID, reqs[0].PayoutID, "items", len(reqs)+len(held)), slices.Concat(reqs, held), hw)
	}
	s.crash(log, CrashAfterIntent)

	out := make([]any, len(reqs), len(reqs)+len(held))
	done := make([]<-chan forwardResult, len(reqs))
	sem := make(chan struct{}, maxBatchForwards)
	for i, req := range reqs {
		ilog := log.With(obs.KeyPayoutID, req.PayoutID)
		if res[i] == intentExists {
			out[i] = batchItemError{PayoutID: req.PayoutID, Error: problem.From(s.duplicate(detached, ilog, req))}
			continue
		}
		ilog.Info("submission intent recorded", "submission_id", recs[i].ID, "client_ref", recs[i].ClientRef)
		done[i] = s.startForward(detached, ilog, recs[i], sem, begun, nil)
	}
	for i, ch := range done {
		if ch == nil {
			continue
		}
		select {
		case fr := <-ch:
			if fr.err != nil {
				out[i] = batchItemError{PayoutID: reqs[i].PayoutID, Error: problem.From(forwardFailed(fr.err))}
				continue
			}
			out[i] = &fr.rec
		case <-r.Context().Done():
			return problem.New(problem.Unavailable,
				"the rail has not answered every item yet; the proxy will record each outcome (GET /v1/submissions/{payout_id})")
		}
	}
	if len(held) > 0 {
		why := pausedProblem(s.retryIn())
		for _, req := range held {
			out = append(out, batchItemError{PayoutID: req.PayoutID, Error: why})
		}
		s.m.pausedRefusals.Add(float64(len(held)))
		log.Info("the rail is paused: forwarded the probe, answered the rest of the batch without recording or forwarding them",
			"probe_payout_id", reqs[0].PayoutID, "held", len(held))
	}
	httpx.WriteJSON(w, http.StatusOK, batchAnswer{Items: out})
	return nil
}
