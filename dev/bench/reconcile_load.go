package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/payouts/payouts/dev/stack"
	"github.com/payouts/payouts/lock/etcdbackend"
	"github.com/payouts/payouts/lock/fencing"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
)

// loader writes the system's state after n payouts were paid correctly:
// accounts of perGrant payouts each, one grant per account, every payout
// POSTED with its history, ledger group, forwarded submission and settled
// rail payment.
type loader struct {
	n, perGrant, accounts int
	ready                 stack.Ready
	etcdPrefix            string
	tokens                []fencing.Token // per account
	railRefs              []string        // per payout
}

func accountID(a int) string { return fmt.Sprintf("bench-acc-%07d", a) }
func payoutID(i int) string  { return fmt.Sprintf("bench-po-%09d", i) }
func holder(a int) string    { return fmt.Sprintf("bench-session-%07d", a) }

// payoutsOf is how many payouts account a has.
func (l *loader) payoutsOf(a int) int { return min(l.perGrant, l.n-a*l.perGrant) }

func (l *loader) load(ctx context.Context, railLoad func(railclient.PaymentRequest) (string, error)) error {
	if err := l.grants(ctx); err != nil {
		return fmt.Errorf("load the grant log: %w", err)
	}
	if err := l.rail(ctx, railLoad); err != nil {
		return fmt.Errorf("load the rail: %w", err)
	}
	if err := l.paydb(ctx); err != nil {
		return fmt.Errorf("load paydb: %w", err)
	}
	if err := l.proxydb(ctx); err != nil {
		return fmt.Errorf("load proxydb: %w", err)
	}
	// A system that made these payouts has long been vacuumed and
	// analysed; a fresh bulk load has not (no visibility map, no
	// statistics), and autovacuum would otherwise run through it during
	// the measured pass.
	for _, url := range []string{l.ready.DatabaseURLs.PayDB, l.ready.DatabaseURLs.ProxyDB} {
		if err := vacuum(ctx, url); err != nil {
			return fmt.Errorf("vacuum the load: %w", err)
		}
	}
	return nil
}

// vacuum runs VACUUM (ANALYZE) on the database at url (outside any
// transaction, as VACUUM requires).
func vacuum(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "VACUUM (ANALYZE)")
	return err
}

// grants writes one ended grant record per account into the lock
// service's etcd keyspace, as the etcd backend does: at the key of its
// token. The tokens are the revisions after the current one, one put each,
// so that etcd's revision stays at or above every token as the backend's
// reads assume.
func (l *loader) grants(ctx context.Context) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: l.ready.Etcd, DialTimeout: 10 * time.Second, Logger: nil})
	if err != nil {
		return err
	}
	defer cli.Close()
	cur, err := cli.Get(ctx, l.etcdPrefix+"/ping", clientv3.WithCountOnly())
	if err != nil {
		return err
	}
	l.tokens = make([]fencing.Token, l.accounts)
	revs := make([]int64, l.accounts)
	err = parallel(ctx, l.accounts, 32, func(ctx context.Context, a int) error {
		at := time.Now().UTC()
		token := cur.Header.Revision + 1 + int64(a)
		v, _ := json.Marshal(map[string]any{"key": fencing.Key(accountID(a)), "owner": "bench", "session_id": holder(a),
			"granted_at": at, "ended_at": at, "end_reason": "released"})
		resp, err := cli.Put(ctx, etcdbackend.EndedGrantKey(l.etcdPrefix, token), string(v))
		if err != nil {
			return err
		}
		l.tokens[a], revs[a] = fencing.Token(token), resp.Header.Revision
		return nil
	})
	if err != nil {
		return err
	}
	// The puts took exactly the revisions given out as tokens: nothing
	// else wrote meanwhile, so no grant the service made has one of them.
	slices.Sort(revs)
	for i, r := range revs {
		if r != cur.Header.Revision+1+int64(i) {
			return fmt.Errorf("etcd was written to while the grant log was loaded (revision %d, want %d): a loaded token may be a real grant's", r, cur.Header.Revision+1+int64(i))
		}
	}
	return nil
}

func (l *loader) rail(ctx context.Context, load func(railclient.PaymentRequest) (string, error)) error {
	l.railRefs = make([]string, l.n)
	return parallel(ctx, l.n, runtime.GOMAXPROCS(0), func(_ context.Context, i int) error {
		ref, err := load(railclient.PaymentRequest{ClientRef: pc.ClientRef(payoutID(i)), Amount: benchAmount, Currency: "EUR", BeneficiaryRef: "BEN-bench"})
		l.railRefs[i] = ref
		return err
	})
}

// inReplicaTx runs fn in one transaction on url with triggers off (the
// rows are a finished history, written as the services would have left
// it).
func inReplicaTx(ctx context.Context, url string, fn func(pgx.Tx) error) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, "SET LOCAL session_replication_role = replica"); err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// copyRows streams n rows into table with COPY.
func copyRows(ctx context.Context, url, table string, cols []string, n int, row func(i int) []any) error {
	return inReplicaTx(ctx, url, func(tx pgx.Tx) error {
		i := 0
		src := pgx.CopyFromFunc(func() ([]any, error) {
			if i >= n {
				return nil, nil
			}
			r := row(i)
			i++
			return r, nil
		})
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{table}, cols, src); err != nil {
			return fmt.Errorf("copy %s: %w", table, err)
		}
		return nil
	})
}

func exec1(ctx context.Context, url, sql string, args ...any) error {
	return inReplicaTx(ctx, url, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sql, args...); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
		return nil
	})
}

const opening = 1000 // each account's balance once its payouts are posted

func (l *loader) paydb(ctx context.Context) error {
	url := l.ready.DatabaseURLs.PayDB
	now := time.Now().UTC()
	err := copyRows(ctx, url, "account", []string{"id", "currency", "balance", "fence_token", "fence_holder"}, l.accounts, func(a int) []any {
		return []any{accountID(a), "EUR", int64(opening), int64(l.tokens[a]), holder(a)}
	})
	if err != nil {
		return err
	}
	err = copyRows(ctx, url, "payout", []string{"id", "account_id", "amount", "currency", "beneficiary_ref", "state", "client_ref",
		"claimed_by", "token", "created_at", "claimed_at", "submitted_at", "settled_at"}, l.n, func(i int) []any {
		a := i / l.perGrant
		return []any{payoutID(i), accountID(a), int64(benchAmount), "EUR", "BEN-bench", string(pc.Posted), pc.ClientRef(payoutID(i)),
			holder(a), int64(l.tokens[a]), now, now, now, now}
	})
	if err != nil {
		return err
	}
	// History: created, then four changes under the account's grant.
	steps := [][2]string{{"", "PENDING"}, {"PENDING", "CLAIMED"}, {"CLAIMED", "RAIL_SUBMITTED"}, {"RAIL_SUBMITTED", "RAIL_ACKED"}, {"RAIL_ACKED", "POSTED"}}
	err = copyRows(ctx, url, "payout_event", []string{"payout_id", "from_state", "to_state", "token", "holder", "actor", "at"}, l.n*len(steps), func(j int) []any {
		i, s := j/len(steps), j%len(steps)
		a := i / l.perGrant
		if s == 0 {
			return []any{payoutID(i), nil, steps[s][1], nil, nil, "bench", now}
		}
		return []any{payoutID(i), steps[s][0], steps[s][1], int64(l.tokens[a]), holder(a), "bench", now}
	})
	if err != nil {
		return err
	}
	// Ledger: each account's opening group, then two entries per payout.
	cols := []string{"group_id", "account_id", "amount", "counterparty_account_id", "payout_id", "token", "created_at"}
	err = copyRows(ctx, url, "ledger_entry", cols, 2*l.accounts, func(j int) []any {
		a := j / 2
		amt := int64(opening + benchAmount*l.payoutsOf(a))
		if j%2 == 0 {
			return []any{"open:" + accountID(a), accountID(a), amt, pc.FundingAccount, nil, nil, now}
		}
		return []any{"open:" + accountID(a), pc.FundingAccount, -amt, accountID(a), nil, nil, now}
	})
	if err != nil {
		return err
	}
	err = copyRows(ctx, url, "ledger_entry", cols, 2*l.n, func(j int) []any {
		i := j / 2
		a := i / l.perGrant
		if j%2 == 0 {
			return []any{"post:" + payoutID(i), accountID(a), int64(-benchAmount), pc.ClearingAccount, payoutID(i), int64(l.tokens[a]), now}
		}
		return []any{"post:" + payoutID(i), pc.ClearingAccount, int64(benchAmount), accountID(a), payoutID(i), int64(l.tokens[a]), now}
	})
	if err != nil {
		return err
	}
	// The system accounts' balances follow their entries.
	total := int64(opening*l.accounts + benchAmount*l.n)
	if err := exec1(ctx, url, "UPDATE account SET balance = balance - $1 WHERE id = $2", total, pc.FundingAccount); err != nil {
		return err
	}
	return exec1(ctx, url, "UPDATE account SET balance = balance + $1 WHERE id = $2", int64(benchAmount*l.n), pc.ClearingAccount)
}

func (l *loader) proxydb(ctx context.Context) error {
	url := l.ready.DatabaseURLs.ProxyDB
	now := time.Now().UTC()
	err := copyRows(ctx, url, "account_high_water", []string{"account_id", "token", "holder"}, l.accounts, func(a int) []any {
		return []any{accountID(a), int64(l.tokens[a]), holder(a)}
	})
	if err != nil {
		return err
	}
	return copyRows(ctx, url, "rail_submission", []string{"payout_id", "account_id", "fence_token", "holder", "client_ref", "amount",
		"currency", "beneficiary_ref", "outcome", "rail_ref", "created_at", "outcome_at"}, l.n, func(i int) []any {
		a := i / l.perGrant
		return []any{payoutID(i), accountID(a), int64(l.tokens[a]), holder(a), pc.ClientRef(payoutID(i)), int64(benchAmount),
			"EUR", "BEN-bench", "ACKED", l.railRefs[i], now, now}
	})
}
