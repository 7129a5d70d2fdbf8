package payment

import "hash/fnv"

// Every posting credits payout-clearing. Its balance is kept in parts
// (paydb migration 00005): a posting adds its total to the part its paying
// account hashes to, so postings of different accounts do not queue on one
// row lock held through each other's commit. An account's balance is its
// row's balance plus the sum of its parts; only payout-clearing has parts.

// balanceParts is how many parts an account's balance may be kept in (the
// table's CHECK allows 0..63).
const balanceParts = 64

// balanceSQL is the balance of account row a.
const balanceSQL = `(a.balance + COALESCE((SELECT sum(bp.amount) FROM account_balance_part bp WHERE bp.account_id = a.id), 0))::bigint`

// accountFrom is account row a with its balance as b.balance, read once.
const accountFrom = `account a CROSS JOIN LATERAL (SELECT ` + balanceSQL + ` AS balance) b`

// creditPartSQL adds $3 to part $2 of account $1's balance.
const creditPartSQL = `INSERT INTO account_balance_part AS bp (account_id, part, amount) VALUES ($1, $2, $3)
	ON CONFLICT (account_id, part) DO UPDATE SET amount = bp.amount + EXCLUDED.amount, updated_at = now()`

// balancePart is the part a posting of account credits.
func balancePart(account string) int16 {
	h := fnv.New32a()
	h.Write([]byte(account))
	return int16(h.Sum32() % balanceParts)
}
