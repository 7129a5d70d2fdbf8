package payment

import (
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// Event is something that happens to a payout (domain model 2.3). The
// server derives the event from the request and, for a claim, the funds.
type Event string

// The events of the payout state machine.
const (
	EvClaim             Event = "claim"              // fenced claim, funds sufficient (or a recovery re-claim)
	EvInsufficientFunds Event = "insufficient_funds" // claim whose funds check failed
	EvSubmitting        Event = "submitting"         // intent to submit, written before the proxy call (D-4)
	EvRailAcked         Event = "rail_acked"         // the rail acknowledged
	EvRailDeclined      Event = "rail_declined"      // the rail declined (business rejection)
	EvRailTimeout       Event = "rail_timeout"       // timeout, 5xx, or no recorded outcome
	EvRailRefused       Event = "rail_refused"       // the proxy refused the submission without forwarding it
	EvPost              Event = "post"               // ledger posted
	EvResolveSettled    Event = "resolve_settled"    // lookup found a settled movement
	EvResolveAbsent     Event = "resolve_absent"     // lookup definitively found nothing
	EvCancel            Event = "cancel"             // operator cancel of a pending payout
	EvAbandon           Event = "abandon"            // operator decision on an ambiguous payout
)

// Events lists every event.
var Events = []Event{EvClaim, EvInsufficientFunds, EvSubmitting, EvRailAcked, EvRailDeclined,
	EvRailTimeout, EvRailRefused, EvPost, EvResolveSettled, EvResolveAbsent, EvCancel, EvAbandon}

// Transition is one row of the transition table.
type Transition struct {
	From  pc.State
	Event Event
	To    pc.State
}

// Transitions is the whole payout state machine (domain model 2.3): every
// accepted (state, event) pair. Any pair not listed is rejected as
// invalid_transition and recorded as a rejected_transition safety event
// (INV-08); POSTED, FAILED and ABANDONED appear in no From column.
var Transitions = []Transition{
	{pc.Pending, EvClaim, pc.Claimed},
	{pc.Pending, EvInsufficientFunds, pc.Failed},
	{pc.Pending, EvCancel, pc.Abandoned},
	{pc.Claimed, EvClaim, pc.Claimed}, // recovery re-claim by a later holder: claimer replaced
	{pc.Claimed, EvSubmitting, pc.RailSubmitted},
	{pc.RailSubmitted, EvRailAcked, pc.RailAcked},
	{pc.RailSubmitted, EvRailDeclined, pc.Failed},
	{pc.RailSubmitted, EvRailTimeout, pc.RailAmbiguous},
	// The proxy refused the submission before forwarding anything (input it
	// will never accept): nothing can have moved, so the payout fails and
	// its held amount is released rather than staying in flight for ever.
	{pc.RailSubmitted, EvRailRefused, pc.Failed},
	{pc.RailAcked, EvPost, pc.Posted},
	{pc.RailAmbiguous, EvResolveSettled, pc.RailAcked},
	{pc.RailAmbiguous, EvResolveAbsent, pc.Failed},
	{pc.RailAmbiguous, EvAbandon, pc.Abandoned},
}

type transitionKey struct {
	from  pc.State
	event Event
}

// table is Transitions indexed; built once, never changed.
var table = func() map[transitionKey]pc.State {
	m := make(map[transitionKey]pc.State, len(Transitions))
	for _, t := range Transitions {
		k := transitionKey{t.From, t.Event}
		if _, dup := m[k]; dup {
			panic("payment: duplicate transition " + string(t.From) + " x " + string(t.Event))
		}
		m[k] = t.To
	}
	return m
}()

// Next is the state machine: the state event moves from to, or false when
// the pair is not in the table. It is total over every (state, event).
func Next(from pc.State, event Event) (pc.State, bool) {
	to, ok := table[transitionKey{from, event}]
	return to, ok
}
