//go:build negativecontrol

package payment

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/lock/fencing"
)

// guardEnabled reports whether this build carries guard 1's fence condition.
// This is the negative-control build: tests use it to show that, without the
// guard, a stale write lands and the detective controls fire. Never released.
const guardEnabled = false

// advanceFence without the fence condition: it still records the highest
// token seen (and its holder) but accepts every token, stale ones included.
func advanceFence(ctx context.Context, tx pgx.Tx, accountID string, token fencing.Token, holder fencing.Holder) (balance int64, ok bool, err error) {
	err = tx.QueryRow(ctx, `
		UPDATE account
		   SET fence_holder = CASE WHEN $2 >= fence_token THEN $3 ELSE fence_holder END,
		       fence_token = GREATEST(fence_token, $2),
		       version = version + 1, updated_at = now()
		 WHERE id = $1
		RETURNING balance`, accountID, int64(token), string(holder)).Scan(&balance)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	return balance, true, nil
}
