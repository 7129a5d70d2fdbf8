package railproxy

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/pgtest"
)

// Malformed paging input is a 4xx, never a 5xx.
func TestSubmissionDigestsRefuseBadQuery(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	for _, q := range []string{"limit=0", "limit=10001", "after=p-a", "after=p-a:x", "after=p-a:-1", "after=%20p:1", "all=true"} {
		req, err := http.NewRequestWithContext(ctxFor(t), http.MethodGet, b.url+"/v1/submission-digests?"+q, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+reconcilerBearer)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("GET /v1/submission-digests?%s: %d, want 400", q, resp.StatusCode)
		}
	}
}

// Each digest carries when its attempt was written (the reconciler dates
// a submission by it to tell whether its grant may have been compacted),
// and the read stays an index-only scan of rail_submission_digest_idx.
func TestSubmissionDigestsCarryWhenWrittenFromTheIndex(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := ctxFor(t)
	before := time.Now().Add(-time.Minute)
	if _, err := b.pc.Submit(ctx, sub("p-1", "acc-1"), 5, holder(1)); err != nil {
		t.Fatal(err)
	}
	rec, err := b.pc.Get(ctx, "p-1")
	if err != nil {
		t.Fatal(err)
	}
	page, err := b.recon.SubmissionDigests(ctx, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Items) != 1 {
		t.Fatalf("%d digests, want 1", len(page.Items))
	}
	if d := page.Items[0]; !d.CreatedAt.Equal(rec.CreatedAt) || d.CreatedAt.Before(before) {
		t.Errorf("digest written at %v, the submission at %v", d.CreatedAt, rec.CreatedAt)
	}

	conn := pgtest.Conn(t, b.dbURL)
	if _, err := conn.Exec(ctx, "SET enable_seqscan = off"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "VACUUM rail_submission"); err != nil {
		t.Fatal(err)
	}
	rows, err := conn.Query(ctx, "EXPLAIN "+submissionDigestsSQL, "", int64(0), 1000)
	if err != nil {
		t.Fatal(err)
	}
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if p := strings.Join(plan, "\n"); !strings.Contains(p, "Index Only Scan using rail_submission_digest_idx") {
		t.Errorf("the digests are not read by an index-only scan of rail_submission_digest_idx:\n%s", p)
	}
}
