//go:build !negativecontrol

package payment

import pc "github.com/payouts/payouts/payment/paymentclient"

// transitionTableEnabled reports whether this build enforces the transition
// table (INV-08's primary).
const transitionTableEnabled = true

// decide is where a mutation asks the state machine: the table alone
// decides, and an unlisted (state, event) pair is rejected.
// transition_negativecontrol.go holds the same function with the table's
// refusal removed, for tests that prove the detective controls fire.
func decide(from pc.State, ev Event) (pc.State, bool) { return Next(from, ev) }
