package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/stack"
)

// accessRow is one row of the route × role table in docs/api.md.
type accessRow struct {
	server, method, path string
	allowed              map[string]bool // role -> allowed
}

var accessRoles = []string{"executor", "reconciler", "operator", "proxy"}

// readAccessTable parses the "Who may call what" table of docs/api.md: the
// test holds the servers to exactly what the document says.
func readAccessTable(t *testing.T) []accessRow {
	t.Helper()
	raw, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	var rows []accessRow
	for _, line := range strings.Split(string(raw), "\n") {
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		if len(cells) != 2+len(accessRoles) {
			continue
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		method, path, ok := strings.Cut(strings.Trim(cells[1], "`"), " ")
		if !ok || !strings.HasPrefix(path, "/v1/") {
			continue
		}
		r := accessRow{server: cells[0], method: method, path: path, allowed: map[string]bool{}}
		for i, role := range accessRoles {
			switch cells[2+i] {
			case "✓":
				r.allowed[role] = true
			case "—":
			default:
				t.Fatalf("docs/api.md: %s %s: cell %q for %s is neither ✓ nor —", method, path, cells[2+i], role)
			}
		}
		rows = append(rows, r)
	}
	if len(rows) < 40 {
		t.Fatalf("docs/api.md: found %d rows of the route × role table; is the table still there?", len(rows))
	}
	return rows
}

// TestRouteRoleTable calls every route of the lock service, the payment
// resource, the rail proxy and the rail with no token, an unknown token and
// each role's token, and asserts exactly the table: 401 without a valid
// token, 403 forbidden for a role the table does not list, and for a listed
// role neither of those nor a 5xx (the bodies are empty objects and the ids
// unknown, so an allowed call is refused for its input and changes nothing).
func TestRouteRoleTable(t *testing.T) {
	if testing.Short() {
		t.Skip("whole-system test")
	}
	rows := readAccessTable(t)
	s := startSystem(t, stack.Options{})
	r := s.st.Ready
	base := map[string]string{"lock": r.LockURL, "payment": r.PaymentURL, "proxy": r.ProxyURL, "rail": r.RailURL}
	tokens := map[string]string{"executor": r.Tokens.Executor, "reconciler": r.Tokens.Reconciler, "operator": r.Tokens.Operator, "proxy": r.Tokens.Proxy}
	for role, tok := range tokens {
		if tok == "" {
			t.Fatalf("the stack issued no %s token", role)
		}
	}
	path := strings.NewReplacer("{id}", "access-x1", "{payout_id}", "access-x1", "{key}", "payout:access-acc").Replace

	call := func(row accessRow, bearer string) (int, string) {
		t.Helper()
		u, ok := base[row.server]
		if !ok {
			t.Fatalf("docs/api.md names an unknown server %q", row.server)
		}
		var body io.Reader
		if row.method != http.MethodGet {
			body = strings.NewReader(`{}`)
		}
		req, err := http.NewRequestWithContext(ctxT(t, time.Minute), row.method, u+path(row.path), body)
		if err != nil {
			t.Fatal(err)
		}
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s %s: %v", row.server, row.method, row.path, err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var p struct {
			Code string `json:"code"`
		}
		_ = json.Unmarshal(raw, &p)
		return resp.StatusCode, p.Code
	}

	for _, row := range rows {
		name := row.server + " " + row.method + " " + row.path
		if st, _ := call(row, ""); st != http.StatusUnauthorized {
			t.Errorf("%s without a token: %d, want 401", name, st)
		}
		if st, _ := call(row, "not-a-token-of-this-stack"); st != http.StatusUnauthorized {
			t.Errorf("%s with an unknown token: %d, want 401", name, st)
		}
		for _, role := range accessRoles {
			st, code := call(row, tokens[role])
			refused := st == http.StatusUnauthorized || (st == http.StatusForbidden && code == "forbidden")
			switch {
			case row.allowed[role] && (refused || st >= 500):
				t.Errorf("%s as %s: %d %s, want allowed (the table lists %s)", name, role, st, code, role)
			case !row.allowed[role] && (st != http.StatusForbidden || code != "forbidden"):
				t.Errorf("%s as %s: %d %s, want 403 forbidden (the table does not list %s)", name, role, st, code, role)
			}
		}
	}
}
