package pgpool

import (
	"context"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The pool settings live here: defaults, the URL's own pool_max_conns, and
// the caller's options, in that order of precedence. (The pool connects
// lazily, so no server is needed.)
func TestSettings(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		url  string
		o    Options
		want int32
	}{
		{"default", "postgres://u@127.0.0.1:1/db", Options{}, DefaultMaxConns},
		{"from the URL", "postgres://u@127.0.0.1:1/db?pool_max_conns=3", Options{}, 3},
		{"from the caller", "postgres://u@127.0.0.1:1/db?pool_max_conns=3", Options{MaxConns: 5}, 5},
		// pgx reads key = value strings with spaces around "=".
		{"from a key = value string", "host=127.0.0.1 port=1 user=u dbname=db pool_max_conns = 3", Options{}, 3},
		// A value that reads like a setting is not one.
		{"another setting's value", "postgres://u@127.0.0.1:1/db?application_name=pool_max_conns%3D3", Options{}, DefaultMaxConns},
	} {
		p, err := New(ctx, "testdb", tc.url, tc.o)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := p.Config().MaxConns; got != tc.want {
			t.Errorf("%s: MaxConns %d, want %d", tc.name, got, tc.want)
		}
		if p.Config().HealthCheckPeriod != healthCheckPeriod || p.Config().ConnConfig.ConnectTimeout != connectTimeout {
			t.Errorf("%s: shared settings not applied: %+v", tc.name, p.Config())
		}
		p.Close()
	}
	p, err := New(ctx, "testdb", "postgres://u@127.0.0.1:1/db", Options{RuntimeParams: map[string]string{"synchronous_commit": "on"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Config().ConnConfig.RuntimeParams["synchronous_commit"] != "on" {
		t.Fatal("runtime parameter not set")
	}
	if got := p.Config().ConnConfig.RuntimeParams["plan_cache_mode"]; got != PlanCacheMode {
		t.Fatalf("plan_cache_mode %q, want %q", got, PlanCacheMode)
	}
	own, err := New(ctx, "testdb", "postgres://u@127.0.0.1:1/db?plan_cache_mode=auto", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	if got := own.Config().ConnConfig.RuntimeParams["plan_cache_mode"]; got != "auto" {
		t.Fatalf("the URL's plan_cache_mode was replaced by %q", got)
	}
	if _, err := New(ctx, "testdb", "", Options{}); err == nil {
		t.Fatal("an empty URL must be refused")
	}
	if _, err := New(ctx, "testdb", "postgres://u:secret@[::1:bad/db", Options{}); err == nil {
		t.Fatal("a malformed URL must be refused")
	}
}
