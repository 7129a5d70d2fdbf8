//go:build negativecontrol

package payment

import pc "github.com/payouts/payouts/payment/paymentclient"

// transitionTableEnabled reports whether this build enforces the transition
// table. This is the negative-control build: never released.
const transitionTableEnabled = false

// eventTarget is the state each event leads to in the table (the first row
// that names it).
var eventTarget = func() map[Event]pc.State {
	m := make(map[Event]pc.State, len(Events))
	for _, t := range Transitions {
		if _, ok := m[t.Event]; !ok {
			m[t.Event] = t.To
		}
	}
	return m
}()

// decide without the table's refusal: a listed pair moves as the table
// says; an unlisted one (a terminal state re-executed, say) is accepted and
// moves to the event's usual target, so a test can show what the detective
// controls see when INV-08's primary is gone.
func decide(from pc.State, ev Event) (pc.State, bool) {
	if to, ok := Next(from, ev); ok {
		return to, true
	}
	to, ok := eventTarget[ev]
	return to, ok
}
