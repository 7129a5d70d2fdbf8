package payment

import (
	"cmp"
	"context"
	"fmt"

	"github.com/payouts/payouts/internal/pgpool"

	pc "github.com/payouts/payouts/payment/paymentclient"
)

// A compound steps request ({"op":"claim","then":"submitting"} or
// {"op":"outcome","then":"post"}) applies a second op in the same
// transaction to every item the first one brought to the state the second
// starts from. Nothing outside happens between the two (the proxy is called
// after RAIL_SUBMITTED is committed, D-4; posting needs nothing but the
// acknowledgement), so one transaction does what two did. Guard 1 still runs
// once, first; each transition is decided by the transition table and
// recorded by its own payout_event row.

// thenFrom is, for each op a compound request may add, the op it may follow
// and the state an item must have reached by that op to take it.
var thenFrom = map[Op]struct {
	after Op
	state pc.State
}{
	OpSubmitting: {OpClaim, pc.Claimed},
	OpPost:       {OpOutcome, pc.RailAcked},
}

// checkThen validates the then member of a steps request whose op is op:
// "" (one step), or the one op allowed to follow op — submitting after
// claim, post after outcome; anything else is invalid_request.
func checkThen(op, then Op) error {
	if f, ok := thenFrom[then]; then != "" && (!ok || f.after != op) {
		return badField("then", "only submitting may follow claim, and post follow outcome; got %q after %q", then, op)
	}
	return nil
}

// label names the ops of b in evidence and logs: "claim", or
// "claim+submitting" for a compound request.
func (b Steps) label() Op {
	if b.Then == "" {
		return b.Cmd.Op
	}
	return b.Cmd.Op + "+" + b.Then
}

// decideThen decides b's second op for an item whose first op was accepted
// as first: when first brought the payout to the state the second starts
// from, the answer is the second transition (its prior the first);
// otherwise (FAILED on funds, declined, RAIL_AMBIGUOUS, ...) the item ends
// at first, with no evidence about the second op, which was never asked of
// it.
func (s *Service) decideThen(ctx context.Context, tx *pgpool.Tx, b Steps, first change, fu *funds) (change, error) {
	if b.Then == "" || first.to != thenFrom[b.Then].state {
		return first, nil
	}
	mid := first.from
	mid.State = first.to
	cmd := b.Cmd
	cmd.Op = b.Then
	ch, rej, err := s.decideOne(ctx, tx, mid, cmd, fu)
	if err != nil {
		return change{}, err
	}
	if rej != nil {
		// The table accepts the second op from the state the first leads
		// to (thenFrom); a refusal here is a defect, never an answer.
		return change{}, fmt.Errorf("payout %s: %s refused in state %s, which %s led to", mid.ID, b.Then, mid.State, b.Cmd.Op)
	}
	ch.prior = &first
	return ch, nil
}

// transitions are ch's transitions in order: a compound item's first, then
// its second; one otherwise.
func (ch change) transitions() []change {
	if ch.prior == nil {
		return []change{ch}
	}
	return append(ch.prior.transitions(), ch)
}

// columns is the union of the column changes of ch's transitions (the
// later one's value where both set one): the payout row is updated once, to
// its final state.
func (ch change) columns() change {
	u := ch
	for p := ch.prior; p != nil; p = p.prior {
		u.claim, u.submitted, u.settled = u.claim || p.claim, u.submitted || p.submitted, u.settled || p.settled
		u.failure, u.railRef, u.errCode = cmp.Or(u.failure, p.failure), cmp.Or(u.railRef, p.railRef), cmp.Or(u.errCode, p.errCode)
	}
	return u
}

// countTransitions counts every transition of the committed changes chs.
func (s *Service) countTransitions(chs []change) {
	for _, ch := range chs {
		for _, t := range ch.transitions() {
			s.m.transitions.WithLabelValues(string(t.from.State), string(t.to)).Inc()
		}
	}
}
