package stack

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"

	"github.com/payouts/payouts/internal/auth"
)

// Tokens are the generated bearer tokens, one per caller role.
type Tokens struct {
	Executor   string `json:"executor"`
	Reconciler string `json:"reconciler"`
	Operator   string `json:"operator"`
	Proxy      string `json:"proxy"` // the rail proxy's credential at the rail
}

func randomToken() string {
	var b [24]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// loadOrCreateAuth keeps one token per role in DIR/auth.json, reused across runs.
func loadOrCreateAuth(path string) (Tokens, error) {
	var f auth.File
	if b, err := os.ReadFile(path); err == nil {
		if err := json.Unmarshal(b, &f); err != nil {
			return Tokens{}, fmt.Errorf("read %s: %w", path, err)
		}
	} else {
		f.Tokens = []auth.FileToken{
			{Token: randomToken(), Role: auth.Executor, Name: "dev-executor"},
			{Token: randomToken(), Role: auth.Reconciler, Name: "dev-reconciler"},
			{Token: randomToken(), Role: auth.Operator, Name: "dev-operator"},
			{Token: randomToken(), Role: auth.Proxy, Name: "dev-proxy"},
		}
		b, _ := json.MarshalIndent(f, "", "  ")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return Tokens{}, err
		}
	}
	var t Tokens
	for _, e := range f.Tokens {
		switch e.Role {
		case auth.Executor:
			t.Executor = e.Token
		case auth.Reconciler:
			t.Reconciler = e.Token
		case auth.Operator:
			t.Operator = e.Token
		case auth.Proxy:
			t.Proxy = e.Token
		}
	}
	if t.Executor == "" || t.Reconciler == "" || t.Operator == "" || t.Proxy == "" {
		return t, fmt.Errorf("%s lacks a token for some role; delete it to regenerate", path)
	}
	return t, nil
}
