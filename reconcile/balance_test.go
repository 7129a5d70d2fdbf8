package reconcile_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/reconcile"
)

// TestBalanceDriftOfAnAccountThatKeepsMoving: an account whose balance
// differs from its ledger is reported although postings keep landing on it
// while the pass reads (as on payout-clearing, which every posting moves);
// a busy account without drift is not.
func TestBalanceDriftOfAnAccountThatKeepsMoving(t *testing.T) {
	e := setup(t)
	drifted, other := e.newAccount(t, 10_000), e.newAccount(t, 10_000)
	e.exec(t, "paydb", false, `UPDATE account SET balance = balance + 100 WHERE id = $1`, drifted)
	// Enough ledger for a pass's reads of it to take a while, so that
	// postings land during them.
	padA, padB := e.newAccount(t, 0), e.newAccount(t, 0)
	e.exec(t, "paydb", false, `WITH g AS (SELECT $1 || '-' || n AS id FROM generate_series(1, 2000) n)
		INSERT INTO ledger_entry (group_id, account_id, amount, counterparty_account_id)
		SELECT id, $1, 1, $2 FROM g UNION ALL SELECT id, $2, -1, $1 FROM g`, padA, padB)
	e.exec(t, "paydb", false, `UPDATE account SET balance = balance + CASE id WHEN $1 THEN 2000 ELSE -2000 END WHERE id IN ($1, $2)`, padA, padB)

	// Balanced postings between the two, one after another, for as long as
	// the pass runs.
	ctx, stop := context.WithCancel(ctxT(t))
	conn, err := pgx.Connect(ctx, e.st.Ready.DatabaseURLs.PayDB)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	moved := make(chan error, 1)
	go func() {
		n := 0
		for ctx.Err() == nil {
			n++
			err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				g := fmt.Sprintf("move-%s-%d", drifted, n)
				if _, err := tx.Exec(ctx, `INSERT INTO ledger_entry (group_id, account_id, amount, counterparty_account_id)
					VALUES ($1, $2, 1, $3), ($1, $3, -1, $2)`, g, drifted, other); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `UPDATE account SET balance = balance + CASE id WHEN $1 THEN 1 ELSE -1 END WHERE id IN ($1, $2)`, drifted, other)
				return err
			})
			if err != nil && ctx.Err() == nil {
				moved <- fmt.Errorf("posting %d: %w", n, err)
				return
			}
		}
		moved <- nil
	}()
	rep := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	stop()
	if err := <-moved; err != nil {
		t.Fatal(err)
	}
	mustFind(t, rep, reconcile.INV03, reconcile.CheckBalanceDrift, map[string]any{"account_id": drifted, "drift": 100})
	mustNotFind(t, rep, reconcile.CheckBalanceDrift, map[string]any{"account_id": other})
}
