//go:build !negativecontrol

package railproxy

// highWaterSQL is guard 2 (DESIGN D-1, domain model 2.6 step 7): one
// conditional statement, the first of the submission's transaction. The
// account's high-water mark keeps the highest (token, holder) it has seen:
// the token moves to GREATEST(stored, presented) and the holder with it only
// when the token goes up. The submission is accepted iff the mark then holds
// exactly the presented (token, holder) — the token is above the mark, or
// equal to it from the same holder. On refusal the mark is unchanged and the
// statement returns the very mark it refused against (the caller rolls
// back), so a token_regression is judged from that mark, never from a later
// read. The row lock it takes serialises every submission of one account.
//
// guard_negativecontrol.go holds the same statement without the condition,
// for tests that prove the detective controls fire.
const highWaterSQL = highWaterAdvance + `
RETURNING hw.token, hw.holder, (hw.token = $2 AND hw.holder = $3)`

// guardEnabled reports whether the fence condition is compiled in.
const guardEnabled = true
