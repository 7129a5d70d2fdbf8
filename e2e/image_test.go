package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/infra"
	"github.com/payouts/payouts/dev/proctest"
	"github.com/payouts/payouts/internal/auth"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
)

// The image runs as this numeric user (deploy/Dockerfile).
const imageUID = 65532

// imageStateDir is the image's directory for state kept on a volume, owned
// by its user (deploy/Dockerfile).
const imageStateDir = "/var/lib/payouts"

// maxImageBytes is the size budget of the image.
const maxImageBytes = 50 << 20

// TestImage builds the container image with `make image` and runs the lock
// service, payment resource, rail proxy, rail stub and an executor from it
// (host network, loopback only, read-only root filesystem) against this
// test's PostgreSQL and etcd; pays payouts end to end; and stops every
// container with SIGTERM, expecting it to exit 0 on that signal alone.
func TestImage(t *testing.T) {
	d := dockerDaemon(t)
	image := d.buildImage(t)

	// What the image is: a numeric non-root user, no shell, small.
	var cfg struct {
		Size   int64 `json:"Size"`
		Config struct {
			User       string   `json:"User"`
			Entrypoint []string `json:"Entrypoint"`
		} `json:"Config"`
	}
	d.inspect(t, image, &cfg)
	if cfg.Config.User != fmt.Sprintf("%d:%d", imageUID, imageUID) {
		t.Errorf("image user %q, want %d:%d", cfg.Config.User, imageUID, imageUID)
	}
	if cfg.Size <= 0 || cfg.Size > maxImageBytes {
		t.Errorf("image size %d bytes, want at most %d", cfg.Size, maxImageBytes)
	}
	if out, err := d.cmd("run", "--rm", "--network", "host", "--entrypoint", "/bin/sh", image, "-c", "true").CombinedOutput(); err == nil {
		t.Errorf("the image has a shell (/bin/sh ran):\n%s", out)
	}
	var version struct{ Version, Revision, Go string }
	if out, err := d.cmd("run", "--rm", "--network", "host", "--read-only", image, "version", "-o", "json").Output(); err != nil {
		t.Errorf("payouts version in the image: %v\n%s", err, out)
	} else if err := json.Unmarshal(out, &version); err != nil || version.Version != "e2e" || len(version.Revision) < 7 {
		t.Errorf("payouts version in the image: %q (%v), want version e2e and the revision stamped", out, err)
	}

	// The test's infrastructure, on loopback.
	ctx := ctxT(t, 10*time.Minute)
	dir := t.TempDir()
	pg, err := infra.NewPGCluster(infra.PGOptions{Dir: filepath.Join(dir, "pg")})
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Stop() })
	for _, db := range []string{"paydb", "proxydb"} {
		if err := pg.CreateDatabase(ctx, db, ""); err != nil {
			t.Fatal(err)
		}
	}
	etcd, err := infra.StartEtcd(ctx, filepath.Join(dir, "etcd"), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(etcd.Close)

	// Secrets as files, mounted read-only and readable only by the image's
	// user; none is on a command line or in the environment.
	secrets := filepath.Join(dir, "secrets")
	tokens := writeImageAuth(t, secrets)
	writeSecret(t, secrets, "executor_token", tokens[auth.Executor])
	writeSecret(t, secrets, "proxy_rail_token", tokens[auth.Proxy])
	writeSecret(t, secrets, "paydb_url", pg.URL("paydb"))
	writeSecret(t, secrets, "proxydb_url", pg.URL("proxydb"))
	mounts := []string{secrets + ":/run/secrets:ro"}

	url := func(port int) string { return "http://127.0.0.1:" + strconv.Itoa(port) }
	port := func() int {
		p, err := infra.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	lockPort, payPort, proxyPort, railPort := port(), port(), port(), port()
	server := func(role string, p int, args ...string) string {
		args = append([]string{"serve", role, "--listen", "127.0.0.1:" + strconv.Itoa(p), "--auth-file", "/run/secrets/auth.json"}, args...)
		return d.run(t, role, mounts, image, args...)
	}
	containers := map[string]string{}
	// The rail stub keeps its payments on a volume of its own, as compose
	// runs it: the image's state directory belongs to its user.
	railVolume := d.prefix + "-rail"
	t.Cleanup(func() { _ = d.cmd("volume", "rm", "--force", railVolume).Run() })
	containers["rail"] = d.run(t, "rail", append(slices.Clone(mounts), railVolume+":"+imageStateDir), image,
		"serve", "rail", "--listen", "127.0.0.1:"+strconv.Itoa(railPort), "--auth-file", "/run/secrets/auth.json",
		"--settlement-window", "2s", "--state-file", imageStateDir+"/rail-payments.jsonl")
	containers["lock"] = server("lock", lockPort, "--backend", "etcd", "--etcd-endpoints", strings.Join(etcd.Endpoints(), ","))
	containers["payment"] = server("payment", payPort, "--migrate", "--database-url-file", "/run/secrets/paydb_url")
	containers["proxy"] = server("proxy", proxyPort, "--migrate", "--database-url-file", "/run/secrets/proxydb_url",
		"--rail-url", url(railPort), "--rail-token-file", "/run/secrets/proxy_rail_token", "--rail-timeout", "5s")
	for role, p := range map[string]int{"rail": railPort, "lock": lockPort, "payment": payPort, "proxy": proxyPort} {
		if err := proctest.WaitReady(ctxT(t, 5*time.Minute), url(p)); err != nil {
			t.Fatalf("%s in the image: %v\n%s", role, err, d.logs(containers[role]))
		}
	}
	containers["executor"] = d.run(t, "executor", mounts, image,
		"run", "executor", "--token-file", "/run/secrets/executor_token", "--lock-url", url(lockPort), "--payment-url", url(payPort), "--proxy-url", url(proxyPort),
		"--owner", "image-executor", "--poll-interval", "200ms", "--session-ttl", "10s")

	// Pay a few payouts end to end.
	s := &system{}
	if s.pay, err = pc.New(url(payPort), tokens[auth.Operator]); err != nil {
		t.Fatal(err)
	}
	if s.rail, err = railclient.New(url(railPort), tokens[auth.Operator]); err != nil {
		t.Fatal(err)
	}
	s.createAccount(t, "img-acc-1", 100_000)
	s.createAccount(t, "img-acc-2", 100_000)
	ids := []string{"img-po-1", "img-po-2", "img-po-3", "img-po-4"}
	for i, id := range ids {
		s.createPayout(t, id, fmt.Sprintf("img-acc-%d", i%2+1), int64(1000+i), "NL00BANK"+strconv.Itoa(i))
	}
	var refs []string
	for _, id := range ids {
		p := s.waitPayoutState(t, id, 5*time.Minute, pc.Posted)
		if paid := s.railPayments(t)[p.ClientRef]; len(paid) != 1 {
			t.Errorf("payout %s: %d payments at the rail, want 1", id, len(paid))
		}
		refs = append(refs, p.ClientRef)
	}

	// Every role ran as the image's user on a read-only root filesystem.
	for role, id := range containers {
		var st struct {
			State struct {
				Pid     int  `json:"Pid"`
				Running bool `json:"Running"`
			} `json:"State"`
			HostConfig struct {
				ReadonlyRootfs bool `json:"ReadonlyRootfs"`
			} `json:"HostConfig"`
		}
		d.inspect(t, id, &st)
		if !st.State.Running || !st.HostConfig.ReadonlyRootfs {
			t.Errorf("%s: running=%v read-only=%v, want both\n%s", role, st.State.Running, st.HostConfig.ReadonlyRootfs, d.logs(id))
			continue
		}
		if uid := processUID(t, st.State.Pid); uid != imageUID {
			t.Errorf("%s runs as uid %d, want %d", role, uid, imageUID)
		}
	}

	// SIGTERM to PID 1: the executor first (it releases its locks), then
	// the servers; each exits 0. Only SIGTERM is sent (docker kill, not
	// docker stop), so a process that ignored it would never exit: the
	// wait is bounded, generously for a loaded machine and the docker CLI
	// calls timed with it.
	const stopBound = time.Minute
	for _, role := range []string{"executor", "proxy", "payment", "lock", "rail"} {
		id := containers[role]
		start := time.Now()
		if out, err := d.cmd("kill", "--signal", "TERM", id).CombinedOutput(); err != nil {
			t.Fatalf("docker kill %s: %v\n%s", role, err, out)
		}
		wctx, cancel := context.WithTimeout(context.Background(), stopBound)
		out, err := d.cmdContext(wctx, "wait", id).Output()
		timedOut := err != nil && wctx.Err() != nil
		cancel()
		took := time.Since(start)
		if timedOut {
			t.Errorf("%s: still running %s after SIGTERM, want it to exit 0 on SIGTERM\n%s", role, took.Round(time.Millisecond), d.logs(id))
			continue
		}
		if err != nil {
			t.Fatalf("docker wait %s: %v", role, err)
		}
		if code := strings.TrimSpace(string(out)); code != "0" {
			t.Errorf("%s: exit %s after %s on SIGTERM, want 0\n%s", role, code, took.Round(time.Millisecond), d.logs(id))
		}
	}

	// Started again on its volume, the rail stub still has what it paid.
	if out, err := d.cmd("start", containers["rail"]).CombinedOutput(); err != nil {
		t.Fatalf("docker start rail: %v\n%s", err, out)
	}
	if err := proctest.WaitReady(ctxT(t, 2*time.Minute), url(railPort)); err != nil {
		t.Fatalf("rail restarted in the image: %v\n%s", err, d.logs(containers["rail"]))
	}
	paid := s.railPayments(t)
	for _, ref := range refs {
		if len(paid[ref]) != 1 {
			t.Errorf("after a restart the rail has %d payments for %s, want the 1 it made before", len(paid[ref]), ref)
		}
	}
}

// writeImageAuth writes an auth file with one token per role into dir and
// returns the tokens.
func writeImageAuth(t *testing.T, dir string) map[auth.Role]string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var f auth.File
	tokens := map[auth.Role]string{}
	for _, r := range auth.AllRoles {
		var b [24]byte
		_, _ = rand.Read(b[:])
		tokens[r] = hex.EncodeToString(b[:])
		f.Tokens = append(f.Tokens, auth.FileToken{Token: tokens[r], Role: r, Name: "image-" + string(r)})
	}
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	writeSecret(t, dir, "auth.json", string(b))
	return tokens
}

// writeSecret writes one secret file, owned by the image's user and
// readable by it alone (servers refuse an auth file others can read).
func writeSecret(t *testing.T, dir, name, content string) {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, imageUID, imageUID); err != nil {
		t.Fatalf("give %s to the image's user %d: %v (the image test runs as root)", name, imageUID, err)
	}
}

// processUID reads the real uid of a host process.
func processUID(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				uid, err := strconv.Atoi(f[0])
				if err == nil {
					return uid
				}
			}
		}
	}
	t.Fatalf("no Uid line in /proc/%d/status", pid)
	return -1
}

// docker is a Docker engine the test can use.
type docker struct {
	env    []string // DOCKER_HOST when the test started its own engine
	prefix string   // container and image names of this test run
}

func (d *docker) cmd(args ...string) *exec.Cmd {
	c := exec.Command("docker", args...)
	c.Env = append(os.Environ(), d.env...)
	return c
}

// cmdContext is cmd, killed when ctx ends.
func (d *docker) cmdContext(ctx context.Context, args ...string) *exec.Cmd {
	c := exec.CommandContext(ctx, "docker", args...)
	c.Env = append(os.Environ(), d.env...)
	return c
}

// dockerDaemon returns a Docker engine: the one `docker` reaches, or one
// this test starts (dockerd from Debian's docker.io, on a private socket,
// with no bridge network and no iptables rules) and stops at the end.
// Under CI=true a missing engine is a failure; elsewhere the test is
// skipped, saying why, only when no engine can be started.
func dockerDaemon(t *testing.T) *docker {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	d := &docker{prefix: "payouts-e2e-" + hex.EncodeToString(b[:])}
	unavailable := func(format string, args ...any) {
		t.Helper()
		msg := fmt.Sprintf(format, args...)
		if os.Getenv("CI") == "true" {
			t.Fatalf("no Docker engine under CI (.ci/run installs docker.io and starts dockerd): %s", msg)
		}
		t.Skipf("skipped: no Docker daemon could be started: %s", msg)
	}
	if _, err := exec.LookPath("docker"); err != nil {
		unavailable("no docker client: %v", err)
	}
	if d.cmd("info").Run() == nil {
		return d
	}
	dockerd, err := exec.LookPath("dockerd")
	if err != nil {
		unavailable("`docker info` fails and there is no dockerd to start (apt-get install docker.io)")
	}
	if runtime.GOOS != "linux" || os.Getuid() != 0 {
		unavailable("`docker info` fails and dockerd needs root on Linux to start")
	}
	// Outside t.TempDir: the engine's own cleanup of its data may leave
	// files the test cannot remove, which should not fail the test.
	root, err := os.MkdirTemp("", "payouts-dockerd-")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(root, "docker.sock")
	logf, err := os.Create(filepath.Join(root, "dockerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	c := exec.Command(dockerd, "--host", "unix://"+sock, "--data-root", filepath.Join(root, "data"),
		"--exec-root", filepath.Join(root, "exec"), "--pidfile", filepath.Join(root, "dockerd.pid"),
		"--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false")
	c.Stdout, c.Stderr = logf, logf
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM, Setpgid: true}
	if err := c.Start(); err != nil {
		unavailable("start dockerd: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = c.Wait(); logf.Close(); close(done) }()
	t.Cleanup(func() {
		_ = c.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			_ = c.Process.Kill()
			<-done
		}
		unmountUnder(root)
		_ = os.RemoveAll(root)
	})
	d.env = []string{"DOCKER_HOST=unix://" + sock}
	deadline := time.Now().Add(5 * time.Minute)
	for d.cmd("info").Run() != nil {
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(root, "dockerd.log"))
			unavailable("dockerd exited at start:\n%s", tailLines(string(log), 20))
		case <-time.After(500 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(root, "dockerd.log"))
			unavailable("dockerd did not answer within 5 minutes:\n%s", tailLines(string(log), 20))
		}
	}
	return d
}

// unmountUnder detaches what the engine left mounted below root (its
// network namespace file), so root can be removed.
func unmountUnder(root string) {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[1], root+"/") {
			_ = syscall.Unmount(f[1], syscall.MNT_DETACH)
		}
	}
}

// buildImage runs `make image` with this run's image name and returns the
// :dev tag; the images are removed at the end.
func (d *docker) buildImage(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, "make", "-C", root, "image", "IMAGE="+d.prefix, "VERSION=e2e")
	c.Env = append(os.Environ(), d.env...)
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	if err := c.Run(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out.String())
	}
	t.Cleanup(func() { _ = d.cmd("rmi", "-f", d.prefix+":dev", d.prefix+":e2e").Run() })
	return d.prefix + ":dev"
}

// run starts a detached container on the host network with a read-only
// root filesystem and returns its id; it is removed at the end.
func (d *docker) run(t *testing.T, name string, mounts []string, image string, args ...string) string {
	t.Helper()
	full := []string{"run", "--detach", "--name", d.prefix + "-" + name, "--network", "host", "--read-only",
		"--cap-drop", "ALL", "--security-opt", "no-new-privileges"}
	for _, m := range mounts {
		full = append(full, "--volume", m)
	}
	full = append(append(full, image), args...)
	out, err := d.cmd(full...).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("docker run %s: %v\n%s", name, err, stderr)
	}
	id := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- %s container log, tail ---\n%s", name, d.logs(id))
		}
		_ = d.cmd("rm", "--force", id).Run()
	})
	return id
}

func (d *docker) logs(id string) string {
	out, _ := d.cmd("logs", "--tail", "30", id).CombinedOutput()
	return string(out)
}

// inspect decodes `docker inspect` of one object into v.
func (d *docker) inspect(t *testing.T, id string, v any) {
	t.Helper()
	out, err := d.cmd("inspect", id).Output()
	if err != nil {
		t.Fatalf("docker inspect %s: %v", id, err)
	}
	var list []json.RawMessage
	if err := json.Unmarshal(out, &list); err != nil || len(list) != 1 {
		t.Fatalf("docker inspect %s: %v (%d objects)", id, err, len(list))
	}
	if err := json.Unmarshal(list[0], v); err != nil {
		t.Fatalf("docker inspect %s: %v", id, err)
	}
}
