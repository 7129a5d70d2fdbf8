package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/payouts/payouts/dev/stack"
)

// TestServersUseRolesThatCannotSwitchTheDefensesOff: the stack serves paydb
// and proxydb as roles with data privileges only, as production should:
// each server reports payouts_database_role_privileged 0 for its database
// (1 would mean its role could disable the append-only and write-once
// triggers or drop the one-forwarded-submission index). Every other test
// on the stack pays through these roles, so their grants are what serving
// needs.
func TestServersUseRolesThatCannotSwitchTheDefensesOff(t *testing.T) {
	t.Parallel()
	s := startSystem(t, stack.Options{})
	for url, db := range map[string]string{s.st.Ready.PaymentURL: "paydb", s.st.Ready.ProxyURL: "proxydb"} {
		resp, err := http.Get(url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		sample := `payouts_database_role_privileged{database="` + db + `"} `
		var got string
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, sample); ok {
				got = v
			}
		}
		if got != "0" {
			t.Errorf("%s/metrics: %s%q; want 0 (a role that owns nothing and is no superuser)", url, sample, got)
		}
	}
}
