//go:build !negativecontrol

package payment

// guardEnabled reports whether this build carries guard 1's fence condition.
const guardEnabled = true

// guardSQL is guard 1 (DESIGN D-1, domain model 2.6 step 5): one
// conditional statement, the first of every mutating transaction. The row
// keeps the highest (token, holder) it has seen: the token moves to
// GREATEST(stored, presented) and the holder with it only when the token
// goes up. The write is accepted iff the row then holds exactly the
// presented (token, holder) — token > fence_token, or token = fence_token
// from the same holder — and on accept both are set. On refusal the row is
// unchanged and the statement returns the very fence it refused against
// (the caller rolls back), so a token_regression is judged from that fence,
// never from a later read. The row lock it takes serialises every mutation
// of the account's payouts until the transaction ends.
//
// guard_negativecontrol.go holds the same statement without the condition.
const guardSQL = fenceAdvance + `
	RETURNING id, balance, fence_token, fence_holder, (fence_token = $2 AND fence_holder = $3)`
