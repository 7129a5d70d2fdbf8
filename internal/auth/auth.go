// Package auth authenticates callers by bearer token and maps each token to
// a role. Tokens are compared in constant time and never logged.
package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync/atomic"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/strictjson"
)

// Role is what a caller is allowed to do.
type Role string

// The caller roles.
const (
	Executor   Role = "executor"
	Reconciler Role = "reconciler"
	Operator   Role = "operator"
	// Proxy is the rail proxy's own identity towards the rail.
	Proxy Role = "proxy"
)

// AllRoles lists every role.
var AllRoles = []Role{Executor, Reconciler, Operator, Proxy}

// Callers are the roles that call the project's own services; Proxy is
// only ever a caller of the rail.
var Callers = []Role{Executor, Reconciler, Operator}

func (r Role) valid() bool { return r == Executor || r == Reconciler || r == Operator || r == Proxy }

// Principal is an authenticated caller.
type Principal struct {
	Name string
	Role Role
	// AnyRole: the caller may call what any role may (insecure mode only,
	// where no token says who it is: an executor, the proxy and the
	// reconciler all reach each other as they do with tokens).
	AnyRole bool
}

// Identity is what GET /v1/whoami answers: the caller's role and name on
// that server, and whether it may call what any role may (insecure mode).
type Identity struct {
	Role    Role   `json:"role"`
	Name    string `json:"name"`
	AnyRole bool   `json:"any_role"`
}

// Allows reports whether a caller of this identity may call a route of
// role.
func (i Identity) Allows(role Role) bool { return i.Role == role || i.AnyRole }

// File is the auth file format (DESIGN §4b).
type File struct {
	Tokens []FileToken `json:"tokens"`
}

// FileToken is one entry of the auth file.
type FileToken struct {
	Token string `json:"token"`
	Role  Role   `json:"role"`
	Name  string `json:"name"`
}

type entry struct {
	digest [32]byte
	p      Principal
}

// Authenticator checks bearer tokens.
type Authenticator struct {
	entries  atomic.Pointer[[]entry]
	insecure bool
	path     string // the auth file, for Reload
}

// Insecure returns an authenticator that lets every request through as an
// operator named "insecure" that may also call what any other role may
// (development only: --insecure-no-auth).
func Insecure() *Authenticator { return &Authenticator{insecure: true} }

// LoadFile reads an auth file. Like ssh with a private key, it refuses a
// file that group or others may read or write: the tokens in it are
// credentials.
func LoadFile(path string) (*Authenticator, error) {
	if err := CheckPrivate(path); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: read auth file: %w", err)
	}
	a, err := Parse(b)
	if err != nil {
		return nil, err
	}
	a.path = path
	return a, nil
}

// Reload re-reads the auth file the authenticator was loaded from (a
// server does on SIGHUP), so tokens are rotated without a restart: add the
// new token, move every caller to it, remove the old one. Requests after
// Reload returns see the new set; when the file is unreadable, not private
// or invalid, the old set stays in force and the error says why.
func (a *Authenticator) Reload() error {
	if a.path == "" {
		return errors.New("auth: no auth file to reload")
	}
	fresh, err := LoadFile(a.path)
	if err != nil {
		return err
	}
	a.entries.Store(fresh.entries.Load())
	return nil
}

// CheckPrivate fails when group or others have any permission on the file
// at path, with the command that fixes it.
func CheckPrivate(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("auth: %s is accessible by group or others (mode %04o); it holds credentials, so it must be private to its owner: chmod 600 %s", path, perm, path)
	}
	return nil
}

// Parse reads auth file contents.
func Parse(b []byte) (*Authenticator, error) {
	// As strictly as a request body: a key given twice (two "tokens"
	// lists, of which the decoder would keep the last) or trailing data
	// is a file merged badly, and loading part of it would drop tokens
	// silently.
	var f File
	if err := strictjson.Decode(b, &f); err != nil {
		return nil, fmt.Errorf("auth: parse auth file: %w", err)
	}
	if len(f.Tokens) == 0 {
		return nil, errors.New("auth: auth file lists no tokens")
	}
	a := &Authenticator{}
	var entries []entry
	seen := map[[32]byte]bool{}
	// A name is one principal with one role: it owns the lock sessions
	// its tokens open, so a second role under the same name would let,
	// say, an operator token keep alive, close or use an executor's
	// sessions. Several tokens of one name and role are a rotation.
	roles := map[string]Role{}
	for i, t := range f.Tokens {
		if len(t.Token) < 16 {
			return nil, fmt.Errorf("auth: token #%d (%s) is shorter than 16 characters", i+1, t.Name)
		}
		if err := CheckToken(t.Token); err != nil {
			return nil, fmt.Errorf("auth: token #%d (%s): %w", i+1, t.Name, err)
		}
		if !t.Role.valid() {
			return nil, fmt.Errorf("auth: token #%d (%s) has role %q; want executor, reconciler, operator or proxy", i+1, t.Name, t.Role)
		}
		if t.Name == "" {
			return nil, fmt.Errorf("auth: token #%d has no name", i+1)
		}
		if r, ok := roles[t.Name]; ok && r != t.Role {
			return nil, fmt.Errorf("auth: token #%d gives name %q role %q, and an earlier token gives it role %q: a name is one principal (it owns the lock sessions its tokens open), so each role needs names of its own", i+1, t.Name, t.Role, r)
		}
		roles[t.Name] = t.Role
		d := sha256.Sum256([]byte(t.Token))
		if seen[d] {
			return nil, fmt.Errorf("auth: token #%d (%s) is listed twice", i+1, t.Name)
		}
		seen[d] = true
		entries = append(entries, entry{digest: d, p: Principal{Name: t.Name, Role: t.Role}})
	}
	a.entries.Store(&entries)
	return a, nil
}

// Authenticate maps a bearer token to its principal.
func (a *Authenticator) Authenticate(token string) (Principal, bool) {
	if a.insecure {
		return Principal{Name: "insecure", Role: Operator, AnyRole: true}, true
	}
	// Compare digests in constant time against every entry, so timing says
	// nothing about which (or whether a) token matched.
	d := sha256.Sum256([]byte(token))
	var found Principal
	ok := 0
	var entries []entry
	if es := a.entries.Load(); es != nil {
		entries = *es
	}
	for _, e := range entries {
		if subtle.ConstantTimeCompare(d[:], e.digest[:]) == 1 {
			found = e.p
			ok = 1
		}
	}
	return found, ok == 1 && token != ""
}

type ctxKey struct{}

// FromContext returns the request's principal.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(ctxKey{}).(Principal)
	return p, ok
}

// WithPrincipal attaches a principal to ctx (for tests and in-process callers).
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, ctxKey{}, p)
}

// Middleware authenticates every request: 401 without a valid bearer token.
// routed, when not nil, is asked about a request that fails
// authentication: one it reports no route (path and method) for goes on to
// next unauthenticated, so that the router answers what it answers
// everyone, 404 or 405, and no handler runs. Asked only on a failure, it
// costs a request that authenticates nothing.
func (a *Authenticator) Middleware(next http.Handler, routed func(*http.Request) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.Header.Values("Authorization")) > 1 {
			// One credential per request (RFC 9110 §11.6.2): with two,
			// this server took the first where a proxy in front of it
			// may have checked the other.
			problem.Write(w, problem.New(problem.InvalidRequest, "the Authorization header is given more than once").With("field", "Authorization"))
			return
		}
		token, found := bearerToken(r.Header.Get("Authorization"))
		if !found && !a.insecure {
			if routed != nil && !routed(r) {
				next.ServeHTTP(w, r)
				return
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="payouts"`)
			problem.Write(w, problem.New(problem.Unauthorized, "a bearer token is required (Authorization: Bearer <token>)"))
			return
		}
		p, ok := a.Authenticate(token)
		if !ok {
			if routed != nil && !routed(r) {
				next.ServeHTTP(w, r)
				return
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="payouts", error="invalid_token"`)
			problem.Write(w, problem.New(problem.Unauthorized, "the bearer token is not valid"))
			return
		}
		next.ServeHTTP(w, r.WithContext(WithPrincipal(r.Context(), p)))
	})
}

// CheckToken says why s cannot be a bearer token: a token is one run of
// visible ASCII characters (RFC 6750's token characters and a few more),
// without white space, a second line or a control character, none of
// which an Authorization header can carry as one token.
func CheckToken(s string) error {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\n' || c == '\r':
			return errors.New("a token is one line; this one has more (a comment or a second token?)")
		case c <= ' ' || c >= 0x7f:
			return fmt.Errorf("a token holds visible ASCII characters only; this one has %q at byte %d", c, i+1)
		}
	}
	return nil
}

// bearerToken is the token of an Authorization header of the Bearer
// scheme, whose name is case-insensitive (RFC 9110 §11.1): "Bearer t",
// "bearer t" and "BEARER t" alike.
func bearerToken(h string) (string, bool) {
	scheme, token, found := strings.Cut(h, " ")
	if !found || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimSpace(token), true
}

// Require answers 403 unless the caller has one of roles.
func Require(roles ...Role) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			p, ok := FromContext(r.Context())
			if !ok {
				problem.Write(w, problem.New(problem.Unauthorized, "not authenticated"))
				return
			}
			for _, role := range roles {
				if p.Role == role || p.AnyRole {
					next.ServeHTTP(w, r)
					return
				}
			}
			problem.Write(w, problem.New(problem.Forbidden, "role %s may not call this endpoint", p.Role))
		})
	}
}

// FromFlags builds the authenticator a server was configured with: the
// auth file, or insecure mode when explicitly asked; neither is an error.
func FromFlags(authFile string, insecure bool) (*Authenticator, error) {
	switch {
	case authFile != "" && insecure:
		return nil, errors.New("auth: --auth-file and --insecure-no-auth are mutually exclusive")
	case authFile != "":
		return LoadFile(authFile)
	case insecure:
		return Insecure(), nil
	default:
		return nil, errors.New("auth: refusing to start without authentication: pass --auth-file PATH (or --insecure-no-auth for local development)")
	}
}
