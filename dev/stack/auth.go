package stack

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/payouts/payouts/internal/auth"
)

// Tokens are the generated bearer tokens, one per caller role.
type Tokens struct {
	Executor   string `json:"executor"`
	Reconciler string `json:"reconciler"`
	Operator   string `json:"operator"`
	// Proxy is the rail proxy's own credential at the rail.
	Proxy string `json:"proxy"`
}

// byRole is where each role's token goes in Tokens.
func (t *Tokens) byRole(r auth.Role) *string {
	switch r {
	case auth.Executor:
		return &t.Executor
	case auth.Reconciler:
		return &t.Reconciler
	case auth.Operator:
		return &t.Operator
	case auth.Proxy:
		return &t.Proxy
	}
	return nil
}

func randomToken() string {
	var b [24]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// loadOrCreateAuth keeps one token per role in DIR/auth.json, reused across
// runs; a role missing from an older file gets a new token. Each token is
// also written to DIR/secrets/ROLE.token (0600) so that no child is given
// a secret on its command line; TokenFiles names them.
func loadOrCreateAuth(dir string) (Tokens, map[string]string, error) {
	path := filepath.Join(dir, "auth.json")
	var f auth.File
	if b, err := os.ReadFile(path); err == nil {
		if err := json.Unmarshal(b, &f); err != nil {
			return Tokens{}, nil, fmt.Errorf("read %s: %w (delete it to regenerate)", path, err)
		}
	}
	var t Tokens
	for _, e := range f.Tokens {
		if p := t.byRole(e.Role); p != nil {
			*p = e.Token
		}
	}
	changed := false
	for _, r := range auth.AllRoles {
		if p := t.byRole(r); p != nil && *p == "" {
			*p = randomToken()
			f.Tokens = append(f.Tokens, auth.FileToken{Token: *p, Role: r, Name: "dev-" + string(r)})
			changed = true
		}
	}
	if changed {
		b, _ := json.MarshalIndent(f, "", "  ")
		if err := writeFile(path, b, 0o600); err != nil {
			return t, nil, err
		}
	}
	secrets := filepath.Join(dir, "secrets")
	if err := os.MkdirAll(secrets, 0o700); err != nil {
		return t, nil, err
	}
	files := map[string]string{}
	for _, r := range auth.AllRoles {
		file := filepath.Join(secrets, string(r)+".token")
		if err := writeFile(file, []byte(*t.byRole(r)+"\n"), 0o600); err != nil {
			return t, nil, err
		}
		files[string(r)] = file
	}
	return t, files, nil
}

// writeSecret writes a secret the children read from a file (0600) and
// returns its path.
func writeSecret(dir, name, value string) (string, error) {
	path := filepath.Join(dir, "secrets", name)
	return path, writeFile(path, []byte(value+"\n"), 0o600)
}
