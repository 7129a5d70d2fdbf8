package payment

import (
	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/lock/fencing"
)

// fenceAdvance moves the fence of an account to the highest (token, holder)
// seen: the token to GREATEST(stored, presented), the holder with it only
// when the token goes up. Guard 1 (guardSQL, guard.go) is this statement
// plus the condition that judges the write. The account is $4 when given
// (a batch of the account's payouts), else payout $1's: the statement finds
// it itself (a trigger keeps a payout's account fixed), so a mutation needs
// no round trip before its transaction.
const fenceAdvance = `
	UPDATE account
	   SET fence_token  = GREATEST(fence_token, $2),
	       fence_holder = CASE WHEN $2 > fence_token THEN $3 ELSE fence_holder END,
	       version = version + 1, updated_at = now()
	 WHERE id = COALESCE($4::text, (SELECT account_id FROM payout WHERE id = $1::text))`

// fence is what guard 1 answered: whether the write is accepted, and the
// account's fence after the statement (on refusal: the fence that refused).
type fence struct {
	account  string
	accepted bool
	balance  int64
	token    fencing.Token
	holder   fencing.Holder
}

// fenceOf names the account whose fence a transaction presents its token
// to: the account itself (a batch), or the account of one payout.
type fenceOf struct {
	payoutID  string
	accountID string
}

func (o fenceOf) args() (payout, account any) {
	if o.accountID != "" {
		return nil, o.accountID
	}
	return o.payoutID, nil
}

// heldOfPayoutSQL is heldSQL for the account of payout $1.
const heldOfPayoutSQL = `SELECT COALESCE(sum(p.amount), 0)::bigint FROM payout p
	WHERE p.account_id = (SELECT account_id FROM payout WHERE id = $1) AND p.state = ANY($2)`

// queueHeld queues the read of the account's held amount (D-7) on b: of
// the account itself, or of the payout's account.
func (o fenceOf) queueHeld(b *pgx.Batch) {
	if o.accountID != "" {
		b.Queue(heldSQL, o.accountID, heldStates)
		return
	}
	b.Queue(heldOfPayoutSQL, o.payoutID, heldStates)
}

// queueGuard queues guard 1 (guardSQL, guard.go) on b; the caller sends b
// as the transaction's first statements, so the guard runs first. Its
// answer is read with scanGuard.
func queueGuard(b *pgx.Batch, of fenceOf, token fencing.Token, holder fencing.Holder) {
	payout, account := of.args()
	b.Queue(guardSQL, payout, int64(token), string(holder), account)
}

// scanGuard reads guard 1's answer. pgx.ErrNoRows: no such payout (or
// account).
func scanGuard(row pgx.Row) (fence, error) {
	var f fence
	var stored int64
	var storedHolder string
	err := row.Scan(&f.account, &f.balance, &stored, &storedHolder, &f.accepted)
	f.token, f.holder = fencing.Token(stored), fencing.Holder(storedHolder)
	return f, err
}
