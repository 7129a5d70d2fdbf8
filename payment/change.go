package payment

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/internal/pgpool"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// This file is what every fenced mutation shares, one payout or a batch of
// one account's payouts: open (guard 1 first), decideOne (the transition
// table, per payout) and writeChanges (the rows of the accepted changes).

// opened is what a fenced transaction found after guard 1.
type opened struct {
	fence   fence
	payouts []pc.Payout // those asked for that exist (of the account, for a batch), by id, locked
	funds   *funds
}

// lockPayoutsSQL reads and locks the payouts a transaction is about: of
// account $2 when given (a batch: a payout of another account is not
// found), in id order.
const lockPayoutsSQL = `SELECT ` + payoutCols + ` FROM payout
	WHERE id = ANY($1::text[]) AND account_id = COALESCE($2::text, account_id) ORDER BY id FOR UPDATE`

// open runs guard 1 as the first statement of tx (pgpool.Tx sends BEGIN
// in front of this batch) and, in the same round trip, locks the payouts
// ids (and, when readHeld, reads the account's held amount, D-7). A refused
// guard leaves the rest unread: the caller rolls back. pgx.ErrNoRows: no
// such payout (or account).
func open(ctx context.Context, tx *pgpool.Tx, of fenceOf, cmd Command, ids []string, readHeld bool) (opened, error) {
	var o opened
	b := &pgx.Batch{}
	queueGuard(b, of, cmd.Token, cmd.Holder)
	// The statements after the guard take arrays: the pool's sessions
	// plan them once (pgpool.PlanCacheMode), not afresh on every call.
	_, account := of.args()
	b.Queue(lockPayoutsSQL, ids, account)
	if readHeld {
		of.queueHeld(b)
	}
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	f, err := scanGuard(br.QueryRow())
	if err != nil {
		return o, err
	}
	o.fence, o.funds = f, &funds{account: f.account, balance: f.balance}
	if !f.accepted {
		return o, nil
	}
	rows, err := br.Query()
	if o.payouts, err = collect(rows, err, scanPayout); err != nil {
		return o, fmt.Errorf("lock payouts: %w", err)
	}
	if readHeld {
		if err := br.QueryRow().Scan(&o.funds.held); err != nil {
			return o, fmt.Errorf("read held amount: %w", err)
		}
		o.funds.read = true
	}
	return o, br.Close()
}

// funds is an account's balance and held amount (D-7) within one
// transaction: the held amount is read once, then kept as a running total
// as the transaction's own changes move payouts in and out of the held
// states, so the claims of a batch decide the funds in order.
type funds struct {
	account string
	balance int64
	held    int64
	read    bool
}

func (f *funds) available(ctx context.Context, tx *pgpool.Tx) (int64, error) {
	if !f.read {
		held, err := heldAmount(ctx, tx, f.account)
		if err != nil {
			return 0, fmt.Errorf("read held amount: %w", err)
		}
		f.held, f.read = held, true
	}
	return f.balance - f.held, nil
}

func (f *funds) move(p pc.Payout, to pc.State) {
	switch {
	case isHeld(to) && !isHeld(p.State):
		f.held += p.Amount
	case !isHeld(to) && isHeld(p.State):
		f.held -= p.Amount
	}
}

// change is one accepted transition, to be written by writeChanges; the
// second transition of a compound step's item carries its first as prior
// (compound.go).
type change struct {
	from                      pc.Payout
	to                        pc.State
	claim, submitted, settled bool
	failure, railRef, errCode *string
	reason                    string
	prior                     *change
}

// decideOne is the per-payout decision of every fenced mutation: the funds
// for a claim of a PENDING payout, then the transition table (decide). A
// pair the table refuses is a rejection, nothing else.
func (s *Service) decideOne(ctx context.Context, tx *pgpool.Tx, p pc.Payout, cmd Command, fu *funds) (change, *rejection, error) {
	ev := cmd.event()
	var available int64
	if cmd.Op == OpClaim && p.State == pc.Pending {
		var err error
		if available, err = fu.available(ctx, tx); err != nil {
			return change{}, nil, err
		}
		if available < p.Amount {
			ev = EvInsufficientFunds
		}
	}
	to, ok := decide(p.State, ev)
	if !ok {
		return change{}, &rejection{state: p.State, event: ev, payout: p}, nil
	}
	if ev == EvAbandon {
		// Refused before the SLA: the transaction rolls back, the fence included.
		if err := s.checkResolutionSLA(ctx, tx, p); err != nil {
			return change{}, nil, err
		}
	}
	ch := change{from: p, to: to}
	str := func(v string) *string {
		if v == "" {
			return nil
		}
		return &v
	}
	switch ev {
	case EvClaim:
		ch.claim = true
		ch.reason = "claimed"
		if p.State == pc.Claimed {
			ch.reason = fmt.Sprintf("re-claimed from %s (token %d)", p.ClaimedBy, p.Token)
		}
	case EvInsufficientFunds:
		ch.failure = str(pc.FailureInsufficientFunds)
		ch.reason = fmt.Sprintf("%s: available %d < amount %d", pc.FailureInsufficientFunds, available, p.Amount)
	case EvSubmitting:
		ch.submitted = true
		ch.reason = "submitting to the rail proxy"
	case EvRailAcked, EvRailDeclined, EvRailTimeout:
		ch.railRef, ch.errCode = str(cmd.RailRef), str(cmd.ErrorCode)
		ch.reason = fmt.Sprintf("outcome %s", cmd.Outcome)
		if cmd.RailRef != "" {
			ch.reason += " rail_ref=" + cmd.RailRef
		}
		if cmd.ErrorCode != "" {
			ch.reason += " error_code=" + cmd.ErrorCode
		}
		if ev == EvRailDeclined {
			ch.failure = str("rail_declined")
		}
	case EvRailRefused:
		ch.failure, ch.errCode = str(pc.FailureRailRefused), str(cmd.ErrorCode)
		ch.reason = fmt.Sprintf("refused by the rail proxy without forwarding (%s): %s", cmd.ErrorCode, cmd.Text)
	case EvPost:
		ch.settled = true
		ch.reason = "posted"
	case EvResolveSettled, EvResolveAbsent:
		ch.reason = fmt.Sprintf("resolution %s: %s", cmd.Resolution, cmd.Text)
		if ev == EvResolveAbsent {
			ch.failure = str("rail_absent")
		}
		// The rail's reference of the settled payment, as an ACKED
		// outcome's: the payout names the payment that paid it.
		ch.railRef = str(cmd.RailRef)
		if cmd.RailRef != "" {
			ch.reason += " rail_ref=" + cmd.RailRef
		}
	case EvCancel:
		ch.failure = str("cancelled")
		ch.reason = cmd.Text
	case EvAbandon:
		ch.failure = str("abandoned")
		ch.reason = cmd.Text
	}
	fu.move(p, to)
	return ch, nil, nil
}

// postLedgerSQL writes a ledger group per posted payout — debit the
// account $3, credit payout-clearing $4, under token $5 — each group
// summing to zero by construction (the deferred trigger checks it at
// commit, INV-03).
const postLedgerSQL = `INSERT INTO ledger_entry (group_id, account_id, amount, counterparty_account_id, payout_id, token)
	SELECT 'post:' || d.id,
	       CASE WHEN s.debit THEN $3::text ELSE $4::text END,
	       CASE WHEN s.debit THEN -d.amount ELSE d.amount END,
	       CASE WHEN s.debit THEN $4::text ELSE $3::text END,
	       d.id, $5::bigint
	  FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS d(id, amount, n)
	 CROSS JOIN (VALUES (true), (false)) AS s(debit)
	 ORDER BY d.n, s.debit DESC`

// updatePayoutsSQL updates every changed payout to its final state ($1..$8)
// and records the events of its transitions ($9..$12: one per transition,
// in order — two for a compound step's item), in one statement.
const updatePayoutsSQL = `WITH d AS (
		SELECT * FROM unnest($1::text[], $2::text[], $3::bool[], $4::bool[], $5::bool[], $6::text[], $7::text[], $8::text[])
			AS d(id, state, claim, submitted, settled, failure, rail_ref, error_code)
	), u AS (
		UPDATE payout p SET
			state = d.state, token = $13,
			claimed_by = CASE WHEN d.claim THEN $14 ELSE p.claimed_by END,
			claimed_at = CASE WHEN d.claim THEN now() ELSE p.claimed_at END,
			submitted_at = CASE WHEN d.submitted THEN now() ELSE p.submitted_at END,
			settled_at = CASE WHEN d.settled THEN now() ELSE p.settled_at END,
			failure_reason = COALESCE(d.failure, p.failure_reason),
			rail_ref = COALESCE(d.rail_ref, p.rail_ref),
			rail_error_code = COALESCE(d.error_code, p.rail_error_code)
		FROM d WHERE p.id = d.id RETURNING p.*
	), e AS (
		INSERT INTO payout_event (payout_id, from_state, to_state, token, holder, actor, reason)
		SELECT ev.id, ev.from_state, ev.to_state, $13, $14, $15, ev.reason
		  FROM unnest($9::text[], $10::text[], $11::text[], $12::text[]) WITH ORDINALITY AS ev(id, from_state, to_state, reason, n)
		 WHERE ev.id IN (SELECT id FROM u)
		 ORDER BY ev.n
	)
	SELECT ` + payoutCols + ` FROM u`

// writeChanges writes the accepted changes of one account's payouts in one
// round trip: the ledger groups of the posted ones and the account's debit
// (their total), every payout's update and event, and last — so its row
// lock is held as briefly as can be — one credit of payout-clearing for the
// total, to the part of its balance this account hashes to (balance.go). It
// returns the payouts as they now stand, in the order of chs.
func writeChanges(ctx context.Context, tx *pgpool.Tx, cmd Command, account string, chs []change) ([]pc.Payout, error) {
	n := len(chs)
	ids, states := make([]string, n), make([]string, n)
	claim, submitted, settled := make([]bool, n), make([]bool, n), make([]bool, n)
	failure, railRef, errCode := make([]*string, n), make([]*string, n), make([]*string, n)
	var evIDs, evFrom, evTo, evReasons []string
	var postedIDs []string
	var postedAmounts []int64
	var total int64
	for i, ch := range chs {
		for _, t := range ch.transitions() {
			evIDs, evFrom = append(evIDs, t.from.ID), append(evFrom, string(t.from.State))
			evTo, evReasons = append(evTo, string(t.to)), append(evReasons, t.reason)
		}
		ch = ch.columns()
		ids[i], states[i] = ch.from.ID, string(ch.to)
		claim[i], submitted[i], settled[i] = ch.claim, ch.submitted, ch.settled
		failure[i], railRef[i], errCode[i] = ch.failure, ch.railRef, ch.errCode
		if ch.settled {
			postedIDs, postedAmounts = append(postedIDs, ch.from.ID), append(postedAmounts, ch.from.Amount)
			total += ch.from.Amount
		}
	}
	b := &pgx.Batch{}
	if len(postedIDs) > 0 {
		b.Queue(postLedgerSQL, postedIDs, postedAmounts, account, pc.ClearingAccount, int64(cmd.Token))
		b.Queue(`UPDATE account SET balance = balance - $2, updated_at = now() WHERE id = $1`, account, total)
	}
	b.Queue(updatePayoutsSQL, ids, states, claim, submitted, settled, failure, railRef, errCode,
		evIDs, evFrom, evTo, evReasons, int64(cmd.Token), string(cmd.Holder), cmd.Actor)
	if len(postedIDs) > 0 {
		b.Queue(creditPartSQL, pc.ClearingAccount, balancePart(account), total)
	}
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	if len(postedIDs) > 0 {
		if _, err := br.Exec(); err != nil {
			return nil, fmt.Errorf("post ledger: %w", err)
		}
		if _, err := br.Exec(); err != nil {
			return nil, fmt.Errorf("update balance: %w", err)
		}
	}
	rows, err := br.Query()
	updated, err := collect(rows, err, scanPayout)
	if err != nil {
		return nil, fmt.Errorf("update payouts and record their events: %w", err)
	}
	if len(postedIDs) > 0 {
		if _, err := br.Exec(); err != nil {
			return nil, fmt.Errorf("update the clearing balance: %w", err)
		}
	}
	if err := br.Close(); err != nil {
		return nil, err
	}
	byID := make(map[string]pc.Payout, len(updated))
	for _, p := range updated {
		byID[p.ID] = p
	}
	out := make([]pc.Payout, n)
	for i, id := range ids {
		p, ok := byID[id]
		if !ok {
			return nil, fmt.Errorf("update payouts: payout %s was not updated", id)
		}
		out[i] = p
	}
	return out, nil
}
