package deploy_test

import (
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// runInit runs deploy/postgres/init.sh as the compose PostgreSQL does on its
// first start, with the secrets in dir and a psql that records its
// arguments instead of connecting. It answers the script's output, psql's
// arguments ("" when psql never ran) and the script's error (nil when it
// exited 0).
func runInit(t *testing.T, dir string, cred *syscall.Credential) (output, args string, err error) {
	t.Helper()
	bin := t.TempDir()
	out := filepath.Join(bin, "psql.args")
	stub := "#!/bin/sh\nprintf '%s\\n' \"$@\" > " + out + "\ncat > /dev/null\n"
	if err := os.WriteFile(filepath.Join(bin, "psql"), []byte(stub), 0o755); err != nil {
		t.Fatal(err)
	}
	script, err := filepath.Abs(filepath.Join("postgres", "init.sh"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", script)
	cmd.Env = []string{"PATH=" + bin + ":/usr/bin:/bin", "POSTGRES_USER=payouts", "PAYOUTS_SECRETS_DIR=" + dir}
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		if err := os.Chmod(bin, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Dir(bin), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(bin, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	b, runErr := cmd.CombinedOutput()
	a, err := os.ReadFile(out)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(b), string(a), runErr
}

// secretsDir writes the two serving roles' password files (mode 0644,
// readable by anyone, unless a test changes that).
func secretsDir(t *testing.T, payment, proxy string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, pw := range map[string]string{"payment_db_password": payment, "proxy_db_password": proxy} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(pw), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestPostgresInitCreatesTheServingRolesWithTheirPasswords: the script
// hands psql each serving role's password, and stops the first start —
// psql never runs — when a password file cannot be read or is empty:
// PostgreSQL takes an empty password for none, and the payment resource
// and the proxy could then never log in.
func TestPostgresInitCreatesTheServingRolesWithTheirPasswords(t *testing.T) {
	t.Parallel()
	dir := secretsDir(t, "pay-secret-1", "proxy-secret-2")
	output, args, err := runInit(t, dir, nil)
	if err != nil {
		t.Fatalf("init.sh: %v\n%s", err, output)
	}
	for _, want := range []string{"payment_pw=pay-secret-1", "proxy_pw=proxy-secret-2", "--username\npayouts"} {
		if !strings.Contains(args, want) {
			t.Errorf("psql arguments %q: want %q", args, want)
		}
	}

	t.Run("missing", func(t *testing.T) {
		dir := secretsDir(t, "pay-secret-1", "proxy-secret-2")
		if err := os.Remove(filepath.Join(dir, "proxy_db_password")); err != nil {
			t.Fatal(err)
		}
		output, args, err := runInit(t, dir, nil)
		if err == nil || args != "" || !strings.Contains(output, "proxy_db_password") {
			t.Errorf("init.sh without proxy_db_password: %v, psql args %q, output %q; want a failure naming the file before psql", err, args, output)
		}
	})
	t.Run("empty", func(t *testing.T) {
		output, args, err := runInit(t, secretsDir(t, "", "proxy-secret-2"), nil)
		if err == nil || args != "" || !strings.Contains(output, "payment_db_password is empty") {
			t.Errorf("init.sh with an empty payment_db_password: %v, psql args %q, output %q; want a failure before psql", err, args, output)
		}
	})
	t.Run("unreadable", func(t *testing.T) {
		// As the image runs it: as its postgres user, here the host's,
		// with the file owned by the payouts image's user, mode 0600.
		if os.Geteuid() != 0 {
			t.Fatal("this check runs the script as the postgres user: run the tests as root (CI does)")
		}
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("the postgres user (Debian's postgresql package; .ci/run installs it): %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		dir := secretsDir(t, "pay-secret-1", "proxy-secret-2")
		f := filepath.Join(dir, "payment_db_password")
		if err := os.Chmod(f, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(f, 65532, 65532); err != nil {
			t.Fatal(err)
		}
		cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		output, args, err := runInit(t, dir, cred)
		if err == nil || args != "" || !strings.Contains(output, "cannot read") {
			t.Errorf("init.sh as postgres with payment_db_password unreadable to it: %v, psql args %q, output %q; want a failure before psql", err, args, output)
		}
		// The secrets recipe (docs/operations.md) gives the file to that
		// user: then it is read.
		if err := os.Chown(f, uid, gid); err != nil {
			t.Fatal(err)
		}
		output, args, err = runInit(t, dir, cred)
		if err != nil || !strings.Contains(args, "payment_pw=pay-secret-1") {
			t.Errorf("init.sh as postgres with payment_db_password its own: %v, psql args %q, output %q", err, args, output)
		}
	})
}
