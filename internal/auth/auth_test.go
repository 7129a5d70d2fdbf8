package auth_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/payouts/payouts/internal/auth"
)

const fileBody = `{"tokens":[
 {"token":"executor-token-0123456789","role":"executor","name":"exec-1"},
 {"token":"proxy-token-0123456789ab","role":"proxy","name":"proxy-1"}]}`

func writeAuthFile(t *testing.T, mode os.FileMode) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "auth.json")
	if err := os.WriteFile(path, []byte(fileBody), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	return path
}

// An auth file that group or others may read is refused, with the command
// that fixes it; a private one loads.
func TestLoadFileRefusesAnAuthFileOthersCanRead(t *testing.T) {
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604, 0o660, 0o602} {
		path := writeAuthFile(t, mode)
		_, err := auth.LoadFile(path)
		if err == nil || !strings.Contains(err.Error(), "chmod 600 "+path) {
			t.Errorf("mode %04o: err %v; want a refusal saying chmod 600 %s", mode, err, path)
		}
	}
	for _, mode := range []os.FileMode{0o600, 0o400} {
		if _, err := auth.LoadFile(writeAuthFile(t, mode)); err != nil {
			t.Errorf("mode %04o: %v", mode, err)
		}
	}
}

// The rail proxy's own identity at the rail is a role of its own.
func TestProxyRole(t *testing.T) {
	a, err := auth.Parse([]byte(fileBody))
	if err != nil {
		t.Fatal(err)
	}
	p, ok := a.Authenticate("proxy-token-0123456789ab")
	if !ok || p.Role != auth.Proxy || p.Name != "proxy-1" {
		t.Fatalf("proxy token: %+v %t", p, ok)
	}
	if _, err := auth.Parse([]byte(`{"tokens":[{"token":"some-token-0123456789","role":"railway","name":"x"}]}`)); err == nil ||
		!strings.Contains(err.Error(), "proxy") {
		t.Fatalf("unknown role: %v; want a refusal listing the roles", err)
	}
}

// Reload swaps the token set in place (token rotation without a restart);
// an invalid or non-private file leaves the set in force.
func TestReload(t *testing.T) {
	path := writeAuthFile(t, 0o600)
	a, err := auth.LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const next = "executor-token-rotated-0123"
	rotated := `{"tokens":[{"token":"executor-token-0123456789","role":"executor","name":"exec-1"},
 {"token":"` + next + `","role":"executor","name":"exec-1"}]}`
	if err := os.WriteFile(path, []byte(rotated), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.Authenticate(next); ok {
		t.Fatal("a token was accepted before the reload")
	}
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	for _, tok := range []string{next, "executor-token-0123456789"} {
		if p, ok := a.Authenticate(tok); !ok || p.Name != "exec-1" {
			t.Fatalf("after the reload %q: %+v %t", tok, p, ok)
		}
	}
	if _, ok := a.Authenticate("proxy-token-0123456789ab"); ok {
		t.Fatal("a token removed from the file is still accepted after the reload")
	}
	for _, bad := range []struct {
		body string
		mode os.FileMode
	}{{`{"tokens":[]}`, 0o600}, {rotated, 0o644}} {
		if err := os.WriteFile(path, []byte(bad.body), 0o600); err != nil {
			t.Fatal(err)
		}
		_ = os.Chmod(path, bad.mode)
		if err := a.Reload(); err == nil {
			t.Fatalf("Reload accepted %q mode %04o", bad.body, bad.mode)
		}
		if _, ok := a.Authenticate(next); !ok {
			t.Fatal("a failed reload dropped the tokens in force")
		}
	}
}

// Without authentication (--insecure-no-auth) no token says who calls, so
// a caller may call what any role may: an executor submits to the proxy
// and the proxy pays at the rail as they do with tokens. With an auth file,
// a token calls only what its own role may.
func TestRequireLetsAnInsecureCallerCallAsAnyRole(t *testing.T) {
	call := func(a *auth.Authenticator, token string, roles ...auth.Role) int {
		h := a.Middleware(auth.Require(roles...)(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusNoContent)
		})), nil)
		req := httptest.NewRequest(http.MethodPost, "/v1/anything", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	insecure := auth.Insecure()
	for _, role := range []auth.Role{auth.Executor, auth.Reconciler, auth.Operator, auth.Proxy} {
		if code := call(insecure, "", role); code != http.StatusNoContent {
			t.Errorf("insecure caller on a %s-only route: %d, want 204", role, code)
		}
	}
	a, err := auth.Parse([]byte(fileBody))
	if err != nil {
		t.Fatal(err)
	}
	if code := call(a, "executor-token-0123456789", auth.Executor); code != http.StatusNoContent {
		t.Errorf("executor token on an executor route: %d, want 204", code)
	}
	if code := call(a, "executor-token-0123456789", auth.Proxy); code != http.StatusForbidden {
		t.Errorf("executor token on a proxy-only route: %d, want 403", code)
	}
}

// An auth file is read as strictly as a request body, and a name is one
// principal with one role: a file giving one name two roles (an operator
// token could then use an executor's lock sessions), a key given twice (the
// decoder would keep only the last "tokens" list) or trailing data is
// refused. Several tokens of one name and role (a rotation) load.
func TestParseRefusesAmbiguousAuthFiles(t *testing.T) {
	for _, c := range []struct{ name, body, want string }{
		{"one name, two roles", `{"tokens":[{"token":"executor-token-0123456789","role":"executor","name":"exec-1"},{"token":"operator-token-0123456789","role":"operator","name":"exec-1"}]}`, `name "exec-1" role "operator"`},
		{"tokens given twice", `{"tokens":[{"token":"executor-token-0123456789","role":"executor","name":"exec-1"}],"tokens":[{"token":"operator-token-0123456789","role":"operator","name":"op-1"}]}`, `"tokens" is given twice`},
		{"trailing data", fileBody + ` {"tokens":[]}`, "after the JSON object"},
		{"null", `null`, "not null"},
		{"a token shorter than 16", `{"tokens":[{"token":"short","role":"executor","name":"exec-1"}]}`, "shorter than 16"},
		{"a token no client can send", `{"tokens":[{"token":"executor-token-0123456789\n","role":"executor","name":"exec-1"}]}`, "one line"},
		{"a token with a space", `{"tokens":[{"token":"executor token 0123456789","role":"executor","name":"exec-1"}]}`, "visible ASCII"},
	} {
		if _, err := auth.Parse([]byte(c.body)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Parse gave %v; want an error saying %s", c.name, err, c.want)
		}
	}
	rotation := `{"tokens":[{"token":"executor-token-0123456789","role":"executor","name":"exec-1"},{"token":"executor-token-9876543210","role":"executor","name":"exec-1"}]}`
	a, err := auth.Parse([]byte(rotation))
	if err != nil {
		t.Fatalf("two tokens of one name and role (a rotation): %v", err)
	}
	for _, tok := range []string{"executor-token-0123456789", "executor-token-9876543210"} {
		if p, ok := a.Authenticate(tok); !ok || p.Name != "exec-1" || p.Role != auth.Executor {
			t.Errorf("rotated token %s: %+v %v; want exec-1, executor", tok, p, ok)
		}
	}
}
