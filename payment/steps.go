package payment

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/pgpool"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/wire"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// stepOps are the mutations POST /accounts/{id}/steps applies in a batch.
var stepOps = map[pc.StepOp]Op{
	pc.StepClaim: OpClaim, pc.StepSubmitting: OpSubmitting, pc.StepOutcome: OpOutcome, pc.StepPost: OpPost,
}

// Steps is one step (or a compound step: Cmd.Op, then Then) applied to
// several payouts of one account.
type Steps struct {
	Account string
	Cmd     Command // Op, Token, Holder, Actor: the same for every item
	Then    Op      // "" or the op that may follow Cmd.Op (compound.go)
	// WhileCovered (claims only): once an item has been claimed, the first
	// PENDING item the funds do not cover ends the claims; it and the
	// items after it are answered as they stand (pc.StepsRequest).
	WhileCovered bool
	Items        []pc.StepItem
}

// itemCommand is the command of one item: the batch's, with the item's
// outcome members.
func (b Steps) itemCommand(i int) Command {
	c := b.Cmd
	c.Outcome, c.RailRef, c.ErrorCode = b.Items[i].Outcome, b.Items[i].RailRef, b.Items[i].ErrorCode
	return c
}

// ApplySteps performs one fenced step on several payouts of one account in
// one transaction. Guard 1 runs once, first, on the account (the fence is
// per account, D-3): refused, nothing changes — the fence included — and
// the answer is the fenced_out error a single mutation gets, with its
// evidence recorded once (for the first item's payout). Accepted, each item
// is decided on its own by the transition table, in order (the claims' funds
// as a running total): a payout in the wrong state is left as it is, with
// its rejected_transition evidence and an invalid_transition problem in its
// slot; a payout of another account (or none) is not_found in its slot.
// A compound request then decides its second op, in the same transaction,
// for every item the first brought to the state the second starts from
// (decideThen). When no item is accepted the transaction is rolled back,
// the fence included.
func (s *Service) ApplySteps(ctx context.Context, b Steps) ([]pc.StepResult, error) {
	if err := wire.ValidFence(b.Cmd.Token, b.Cmd.Holder); err != nil {
		return nil, err
	}
	if err := checkThen(b.Cmd.Op, b.Then); err != nil {
		return nil, err
	}
	if err := checkWhileCovered(b.Cmd.Op, b.WhileCovered); err != nil {
		return nil, err
	}
	if err := checkItems(b.Cmd.Op, b.Items); err != nil {
		return nil, err
	}
	res, rejs, fenced, err := s.stepsTx(ctx, b)
	if err != nil {
		// The items refused before the error were never to be written:
		// their evidence stands whether the others' write failed or not.
		s.recordRejections(ctx, b, rejs, nil)
		return nil, err
	}
	if fenced != nil {
		s.afterRefusalHook()
		cmd := b.Cmd
		cmd.Op = b.label()
		return nil, s.reject(ctx, b.Account, b.Items[0].PayoutID, cmd, fenced)
	}
	s.recordRejections(ctx, b, rejs, res)
	return res, nil
}

// recordRejections records the evidence of every item of b the transition
// table refused (rejs[i] != nil) and, when res is not nil, puts each
// item's problem in its slot.
func (s *Service) recordRejections(ctx context.Context, b Steps, rejs []*rejection, res []pc.StepResult) {
	for i, rej := range rejs {
		if rej == nil {
			continue
		}
		s.afterRefusalHook()
		err := s.reject(ctx, b.Account, b.Items[i].PayoutID, b.itemCommand(i), rej)
		if res != nil {
			res[i].Err = problem.From(err)
		}
	}
}

func (s *Service) afterRefusalHook() {
	if hook := s.afterRefusal.Load(); hook != nil {
		(*hook)()
	}
}

func (s *Service) stepsTx(ctx context.Context, b Steps) ([]pc.StepResult, []*rejection, *rejection, error) {
	tx, err := pgpool.Begin(ctx, s.pool)
	if err != nil {
		return nil, nil, nil, err
	}
	defer tx.Rollback(ctx)

	ids := make([]string, len(b.Items))
	for i, it := range b.Items {
		ids[i] = it.PayoutID
	}
	o, err := open(ctx, tx, fenceOf{accountID: b.Account}, b.Cmd, ids, b.Cmd.Op == OpClaim)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, nil, problem.New(problem.NotFound, "no account %q", b.Account)
	}
	if err != nil {
		return nil, nil, nil, err
	}
	if !o.fence.accepted {
		return nil, nil, &rejection{fenced: true, fence: o.fence}, nil
	}
	found := make(map[string]pc.Payout, len(o.payouts))
	for _, p := range o.payouts {
		found[p.ID] = p
	}
	res := make([]pc.StepResult, len(b.Items))
	rejs := make([]*rejection, len(b.Items))
	var chs []change
	var slots []int
	// claimed: an item of this request was claimed (its money is held and
	// may come back); stopped: the claims ended at an item the funds do
	// not cover.
	claimed, stopped := false, false
	for i, it := range b.Items {
		p, ok := found[it.PayoutID]
		if !ok {
			res[i] = pc.StepResult{PayoutID: it.PayoutID, Err: problem.New(problem.NotFound, "no payout %q in account %q", it.PayoutID, b.Account)}
			continue
		}
		if !stopped && b.WhileCovered && claimed && p.State == pc.Pending {
			available, err := o.funds.available(ctx, tx)
			if err != nil {
				return nil, rejs, nil, err
			}
			stopped = available < p.Amount
		}
		if stopped && p.State == pc.Pending {
			// Left to wait for funds; any other item is judged as ever,
			// its refusal recorded.
			res[i] = pc.StepResult{Payout: p, PayoutID: p.ID}
			continue
		}
		ch, rej, err := s.decideOne(ctx, tx, p, b.itemCommand(i), o.funds)
		if err != nil {
			return nil, rejs, nil, err
		}
		if rej != nil {
			rej.fence = o.fence
			rejs[i] = rej
			res[i] = pc.StepResult{PayoutID: it.PayoutID}
			continue
		}
		claimed = claimed || ch.claim
		if ch, err = s.decideThen(ctx, tx, b, ch, o.funds); err != nil {
			return nil, rejs, nil, err
		}
		chs, slots = append(chs, ch), append(slots, i)
	}
	if len(chs) == 0 {
		// Nothing accepted: roll back, the fence included (D-1).
		return res, rejs, nil, nil
	}
	tx.CommitAfterNextBatch() // COMMIT rides behind the write batch
	out, err := writeChanges(ctx, tx, b.Cmd, o.fence.account, chs)
	if err != nil {
		return nil, rejs, nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, rejs, nil, fmt.Errorf("commit %s of %d payouts: %w", b.label(), len(chs), err)
	}
	for k, i := range slots {
		res[i] = pc.StepResult{Payout: out[k], PayoutID: out[k].ID}
	}
	s.countTransitions(chs)
	return res, rejs, nil, nil
}

// checkWhileCovered validates the while_covered member of a steps request
// whose op is op: it belongs to claims only.
func checkWhileCovered(op Op, whileCovered bool) error {
	if whileCovered && op != OpClaim {
		return badField("while_covered", "belongs to op claim only, got op %q", op)
	}
	return nil
}

// decodeSteps reads the body of POST /accounts/{id}/steps.
func decodeSteps(r *http.Request, account string) (Steps, error) {
	var req pc.StepsRequest
	if err := httpx.DecodeJSON(r, &req); err != nil {
		return Steps{}, err
	}
	op, ok := stepOps[req.Op]
	if !ok {
		return Steps{}, badField("op", "must be claim, submitting, outcome or post, got %q", req.Op)
	}
	then := Op(req.Then)
	if err := checkThen(op, then); err != nil {
		return Steps{}, err
	}
	if err := checkWhileCovered(op, req.WhileCovered); err != nil {
		return Steps{}, err
	}
	if err := wire.ValidFence(req.Token, req.Holder); err != nil {
		return Steps{}, err
	}
	if err := checkItems(op, req.Items); err != nil {
		return Steps{}, err
	}
	return Steps{Account: account, Cmd: Command{Op: op, Token: req.Token, Holder: req.Holder}, Then: then,
		WhileCovered: req.WhileCovered, Items: req.Items}, nil
}

// checkItems holds a batch's items to what ApplySteps can decide: 1 to
// pc.MaxStepItems payouts, each once (two items of one payout would both
// be decided against the row as it stood: a payout posted twice), with
// outcome members for op outcome only.
func checkItems(op Op, items []pc.StepItem) error {
	if len(items) == 0 || len(items) > pc.MaxStepItems {
		return badField("items", "between 1 and %d payouts, got %d", pc.MaxStepItems, len(items))
	}
	seen := make(map[string]bool, len(items))
	for i, it := range items {
		prefix := fmt.Sprintf("items[%d].", i)
		if err := wire.ValidID(prefix+"payout_id", it.PayoutID); err != nil {
			return err
		}
		if seen[it.PayoutID] {
			return badField(prefix+"payout_id", "payout %q is listed twice", it.PayoutID)
		}
		seen[it.PayoutID] = true
		if op == OpOutcome {
			if err := validOutcome(prefix, it.Outcome, it.RailRef, it.ErrorCode); err != nil {
				return err
			}
		} else if it.Outcome != "" || it.RailRef != "" || it.ErrorCode != "" {
			return badField(prefix+"outcome", "outcome, rail_ref and error_code belong to op outcome only")
		}
	}
	return nil
}

func (s *Service) handleSteps(w http.ResponseWriter, r *http.Request) error {
	account, err := pathID(r, "account")
	if err != nil {
		return err
	}
	if reservedAccount(account) {
		return problem.New(problem.NotFound, "%q is a system account: it has no payouts", account)
	}
	b, err := decodeSteps(r, account)
	if err != nil {
		return err
	}
	b.Cmd.Actor = actor(r)
	res, err := s.ApplySteps(r.Context(), b)
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, stepsAnswer(res))
	return nil
}

// stepAnswer is one item of the answer of POST /accounts/{id}/steps as the
// encoder writes it directly (no MarshalJSON of its own, whose bytes the
// encoder would scan again): the payout's members, or (Payout nil)
// {"payout_id", "error"} — the JSON of pc.StepResult.
type stepAnswer struct {
	*pc.Payout
	PayoutID string         `json:"payout_id,omitempty"`
	Error    *problem.Error `json:"error,omitempty"`
}

type stepsAnswerBody struct {
	Items []stepAnswer `json:"items"`
}

// stepsAnswer is the body answering res.
func stepsAnswer(res []pc.StepResult) stepsAnswerBody {
	out := make([]stepAnswer, len(res))
	for i := range res {
		if res[i].Err != nil {
			out[i] = stepAnswer{PayoutID: res[i].PayoutID, Error: res[i].Err}
		} else {
			out[i] = stepAnswer{Payout: &res[i].Payout}
		}
	}
	return stepsAnswerBody{Items: out}
}
