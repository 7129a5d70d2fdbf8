//go:build !negativecontrol

package payment

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/lock/fencing"
)

// guardEnabled reports whether this build carries guard 1's fence condition.
const guardEnabled = true

// advanceFence is guard 1 (DESIGN D-1, domain model 2.6 step 5): one
// conditional statement, the first of every mutating transaction. It
// accepts the write iff token > fence_token, or token = fence_token from the
// same holder, and then sets both; the row lock it takes serialises every
// mutation of the account's payouts until the transaction ends. ok is false
// when the account refused the token (or does not exist).
func advanceFence(ctx context.Context, tx pgx.Tx, accountID string, token fencing.Token, holder fencing.Holder) (balance int64, ok bool, err error) {
	err = tx.QueryRow(ctx, `
		UPDATE account
		   SET fence_token = $2, fence_holder = $3, version = version + 1, updated_at = now()
		 WHERE id = $1
		   AND (fence_token < $2 OR (fence_token = $2 AND fence_holder = $3))
		RETURNING balance`, accountID, int64(token), string(holder)).Scan(&balance)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	return balance, true, nil
}
