package cmd

import (
	"encoding/json"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// silentDatabase listens on loopback, accepts every connection and never
// answers one, as a host whose PostgreSQL hangs.
func silentDatabase(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		done  = make(chan struct{})
	)
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// TestStartWaitsBoundedForADatabaseThatDoesNotAnswer: a server whose
// database accepts connections and never answers says so at WARN while it
// waits (naming the database and its host:port, never the password), and
// gives up after a bounded wait with an error naming them, with or
// without --migrate. It waited a minute (five with --migrate) without a
// word, then exited with "failed to receive message: timeout".
func TestStartWaitsBoundedForADatabaseThatDoesNotAnswer(t *testing.T) {
	prevAttempt, prevLimit := dbAttemptTimeout, dbWaitLimit
	t.Cleanup(func() { dbAttemptTimeout, dbWaitLimit = prevAttempt, prevLimit })
	dbAttemptTimeout, dbWaitLimit = 300*time.Millisecond, 2*time.Second

	addr := silentDatabase(t)
	url := "postgres://payouts:s3cret-pw@" + addr + "/db?sslmode=disable"
	for _, tc := range []struct {
		db   string
		args []string
	}{
		{"paydb", []string{"serve", "payment"}},
		{"paydb", []string{"serve", "payment", "--migrate"}},
		{"lockdb", []string{"serve", "lock", "--backend", "postgres"}},
		{"lockdb", []string{"serve", "lock", "--backend", "postgres", "--migrate"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			start := time.Now()
			code, _, errOut := runArgs(t, append(tc.args, "--database-url", url, "--insecure-no-auth", "--listen", "127.0.0.1:0")...)
			took := time.Since(start)
			if code != 1 {
				t.Fatalf("exit %d, want 1; stderr:\n%s", code, errOut)
			}
			// Generous: the wait is 2 s here; it was a minute.
			if took > 40*time.Second {
				t.Errorf("gave up after %v, want about %v", took, dbWaitLimit)
			}
			if strings.Contains(errOut, "s3cret-pw") {
				t.Errorf("stderr names the password:\n%s", errOut)
			}
			warns, last := 0, ""
			for _, line := range strings.Split(strings.TrimSpace(errOut), "\n") {
				var rec map[string]any
				if json.Unmarshal([]byte(line), &rec) != nil {
					last = line
					continue
				}
				if rec["level"] == "WARN" && rec["msg"] == "database does not answer yet" && rec["db"] == tc.db && rec["addr"] == addr {
					warns++
				}
			}
			if warns == 0 {
				t.Errorf("no WARN line \"database does not answer yet\" naming %s at %s; stderr:\n%s", tc.db, addr, errOut)
			}
			if want := "payouts: " + tc.db + " at " + addr + " did not answer within 2s"; !strings.HasPrefix(last, want) {
				t.Errorf("last line %q, want it to begin %q", last, want)
			}
		})
	}
}

// A database that refuses the connection is an error at once, not waited
// for: nothing listens there, and waiting would not change that.
func TestStartFailsAtOnceOnADatabaseThatRefuses(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: connections are refused
	start := time.Now()
	code, _, errOut := runArgs(t, "serve", "payment", "--database-url", "postgres://payouts:s3cret-pw@"+addr+"/db?sslmode=disable", "--insecure-no-auth", "--listen", "127.0.0.1:0")
	if code != 1 || !strings.Contains(errOut, "payouts: paydb at "+addr+": ") || strings.Contains(errOut, "database does not answer yet") {
		t.Fatalf("exit %d, stderr:\n%s\nwant 1 and the refusal, without waiting", code, errOut)
	}
	if took := time.Since(start); took > dbWaitLimit/2 {
		t.Errorf("took %v to give up on a refused connection", took)
	}
}
