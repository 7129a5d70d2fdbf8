//go:build !negativecontrol

package railproxy

// highWaterSQL is guard 2 (DESIGN D-1, domain model 2.6 step 7): one
// conditional statement, the first of the submission's transaction. It
// advances the account's high-water mark to the presented token iff the
// token is above it, or equal to it from the same holder; otherwise it
// returns no row and the submission is fenced out. The row lock it takes
// serialises every submission of one account.
//
// guard_negativecontrol.go holds the same statement without the fence
// condition, for tests that prove the detective controls fire.
const highWaterSQL = `
INSERT INTO account_high_water AS hw (account_id, token, holder, updated_at)
VALUES ($1, $2, $3, now())
ON CONFLICT (account_id) DO UPDATE
   SET token = EXCLUDED.token, holder = EXCLUDED.holder, updated_at = now()
 WHERE hw.token < EXCLUDED.token
    OR (hw.token = EXCLUDED.token AND hw.holder = EXCLUDED.holder)
RETURNING hw.token`

// guardEnabled reports whether the fence condition is compiled in.
const guardEnabled = true
