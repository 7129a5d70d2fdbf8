package payment

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/lock/fencing"
)

// fenceAdvance moves the fence of payout $1's account to the highest
// (token, holder) seen: the token to GREATEST(stored, presented), the
// holder with it only when the token goes up. Guard 1 (guardSQL, guard.go)
// is this statement plus the condition that judges the write. It finds the
// account itself (a trigger keeps a payout's account fixed), so a mutation
// needs no round trip before its transaction.
const fenceAdvance = `
	UPDATE account
	   SET fence_token  = GREATEST(fence_token, $2),
	       fence_holder = CASE WHEN $2 > fence_token THEN $3 ELSE fence_holder END,
	       version = version + 1, updated_at = now()
	 WHERE id = (SELECT account_id FROM payout WHERE id = $1)`

// fence is what guard 1 answered: whether the write is accepted, and the
// account's fence after the statement (on refusal: the fence that refused).
type fence struct {
	account  string
	accepted bool
	balance  int64
	token    fencing.Token
	holder   fencing.Holder
}

// advanceFence runs guard 1 (guardSQL, guard.go) in tx as the transaction's
// first statement. pgx.ErrNoRows: no such payout.
func advanceFence(ctx context.Context, tx pgx.Tx, payoutID string, token fencing.Token, holder fencing.Holder) (fence, error) {
	var f fence
	var stored int64
	var storedHolder string
	err := tx.QueryRow(ctx, guardSQL, payoutID, int64(token), string(holder)).Scan(&f.account, &f.balance, &stored, &storedHolder, &f.accepted)
	f.token, f.holder = fencing.Token(stored), fencing.Holder(storedHolder)
	return f, err
}
