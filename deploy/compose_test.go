package deploy_test

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v2"

	"github.com/payouts/payouts/cmd"
)

const composeFile = "compose.yaml"

// loadCompose loads deploy/compose.yaml as Docker Compose does: schema
// validation, anchors and merges resolved, then checked for consistency.
func loadCompose(t *testing.T) *types.Project {
	t.Helper()
	opts, err := cli.NewProjectOptions([]string{composeFile}, cli.WithName("payouts"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("%s: %v", composeFile, err)
	}
	return p
}

// secretFlags must never be given on a command line: each has a -file form.
var secretFlags = []string{"token", "rail-token", "rail-report-token", "insecure-no-auth"}

// TestComposeCommandLines parses every payouts command line in
// deploy/compose.yaml with the binary's own command tree, so a renamed or
// removed flag breaks this test rather than a deployment.
func TestComposeCommandLines(t *testing.T) {
	project := loadCompose(t)
	binary := imageEntrypoint(t)
	replicas := map[string]int{}
	for name, s := range project.Services {
		if !strings.HasPrefix(s.Image, "payouts:") {
			continue
		}
		if !s.ReadOnly {
			t.Errorf("%s: the payouts image runs with a read-only root filesystem (read_only: true)", name)
		}
		if len(s.Command) == 0 {
			t.Errorf("%s: no command (the image's entrypoint is the payouts binary; give the role as a list)", name)
			continue
		}
		path, flags := checkCommandLine(t, name, s.Command)
		if path == "migrate" {
			checkMigrateService(t, name, s, flags)
		} else {
			flags = append(flags, checkHealthcheck(t, name, s, path, binary)...)
		}
		if path == "serve payment" || path == "serve proxy" {
			checkServesAsItsOwnRole(t, project, name, s, flags)
		}
		n := 1
		if s.Deploy != nil && s.Deploy.Replicas != nil {
			n = *s.Deploy.Replicas
		}
		replicas[path] += n
		for _, f := range secretFlags {
			if slices.Contains(flags, f) {
				t.Errorf("%s: --%s puts a secret on the command line; use its -file form", name, f)
			}
		}
		for i, a := range s.Command {
			if a != "--database-url" || i+1 == len(s.Command) {
				continue
			}
			u, err := url.Parse(s.Command[i+1])
			if err != nil {
				t.Errorf("%s: --database-url: %v", name, err)
			} else if _, has := u.User.Password(); has {
				t.Errorf("%s: --database-url carries a password; use a pgpass file (PGPASSFILE)", name)
			}
		}
		for k := range s.Environment {
			if strings.HasPrefix(k, "PAYOUTS_") {
				t.Errorf("%s: %s: give flags on the command line and secrets as files", name, k)
			}
		}
		for _, sec := range s.Secrets {
			if project.Secrets[sec.Source].File == "" {
				t.Errorf("%s: secret %q is not a file", name, sec.Source)
			}
		}
	}
	want := map[string]int{"serve lock": 2, "serve payment": 1, "serve proxy": 1, "serve rail": 1, "run executor": 2, "reconcile": 1, "migrate": 2}
	for path, n := range want {
		if replicas[path] != n {
			t.Errorf("compose runs %d of `payouts %s`, want %d", replicas[path], path, n)
		}
	}
	etcd := 0
	for _, s := range project.Services {
		if strings.Contains(s.Image, "etcd") {
			etcd++
		}
	}
	for _, svc := range []string{"postgres", "prometheus", "grafana"} {
		if _, ok := project.Services[svc]; !ok {
			t.Errorf("compose has no %s service", svc)
		}
	}
	if etcd != 3 {
		t.Errorf("compose runs %d etcd members, want 3", etcd)
	}
}

// checkMigrateService: a one-shot migration runs once (no restart) as the
// database's owner, and grants a serving role what serving needs.
func checkMigrateService(t *testing.T, name string, s types.ServiceConfig, flags []string) {
	t.Helper()
	if s.Restart != "no" {
		t.Errorf("%s: restart %q: a migration runs once (restart: \"no\")", name, s.Restart)
	}
	if !slices.Contains(flags, "grant-to") {
		t.Errorf("%s: no --grant-to: the server of this database would have to serve as its owner", name)
	}
}

// checkServesAsItsOwnRole: the payment resource and the proxy do not
// migrate, serve as a role that is not the databases' owner (the image's
// POSTGRES_USER), start only once their database's migration has
// finished, and get no pgpass holding the owner's password.
func checkServesAsItsOwnRole(t *testing.T, project *types.Project, name string, s types.ServiceConfig, flags []string) {
	t.Helper()
	owner := ""
	if o := project.Services["postgres"].Environment["POSTGRES_USER"]; o != nil {
		owner = *o
	}
	if slices.Contains(flags, "migrate") {
		t.Errorf("%s: --migrate: a server migrating its database must own it; migrate in a migrate service and serve as a role granted by it", name)
	}
	u, err := url.Parse(flagValue(s.Command, "database-url"))
	if err != nil || u.User == nil || owner == "" || u.User.Username() == owner {
		t.Errorf("%s: --database-url %q: serve as a role of its own, not the owner %q", name, flagValue(s.Command, "database-url"), owner)
	}
	migrated := false
	for dep, d := range s.DependsOn {
		if m, ok := project.Services[dep]; ok && len(m.Command) > 0 && m.Command[0] == "migrate" {
			migrated = d.Condition == types.ServiceConditionCompletedSuccessfully
		}
	}
	if !migrated {
		t.Errorf("%s: does not wait for its database's migrate service to complete successfully", name)
	}
	for _, sec := range s.Secrets {
		if sec.Source == "pgpass" || sec.Source == "pg_password" {
			t.Errorf("%s: gets the owner's password (secret %s)", name, sec.Source)
		}
	}
}

// roleOfCommand is the role `payouts status --only` names for the service
// a command runs, and the flag of the address it serves /healthz on.
var roleOfCommand = map[string]struct{ role, listen string }{
	"serve lock": {"lock", "listen"}, "serve payment": {"payment", "listen"}, "serve proxy": {"proxy", "listen"},
	"serve rail": {"rail", "listen"}, "run executor": {"executor", "metrics-listen"}, "reconcile": {"reconciler", "listen"},
}

// checkHealthcheck holds a payouts service's healthcheck to the image: exec
// form (the image has no shell) running the image's binary, as
// `payouts status --only ROLE --health-only` for the service's own role at
// the port it listens on (checked against the binary's flags like the
// command), with no token. It returns the flags given.
func checkHealthcheck(t *testing.T, service string, s types.ServiceConfig, path, binary string) []string {
	t.Helper()
	hc := s.HealthCheck
	if hc == nil || hc.Disable || len(hc.Test) < 3 {
		t.Errorf("%s: no healthcheck; want [\"CMD\", %q, \"status\", \"--only\", ROLE, \"--health-only\", ...]", service, binary)
		return nil
	}
	if hc.Test[0] != "CMD" || hc.Test[1] != binary {
		t.Errorf("%s: healthcheck %q: want exec form [\"CMD\", %q, ...] (the image has no shell)", service, hc.Test, binary)
		return nil
	}
	args := []string(hc.Test[2:])
	hpath, flags := checkCommandLine(t, service+" healthcheck", args)
	want, known := roleOfCommand[path]
	if hpath != "status" || !known {
		t.Errorf("%s: healthcheck runs `payouts %s` for `payouts %s`; want `payouts status --only ROLE --health-only`", service, hpath, path)
		return flags
	}
	if only := flagValue(args, "only"); only != want.role || !slices.Contains(flags, "health-only") {
		t.Errorf("%s: healthcheck %q: want --only %s --health-only", service, args, want.role)
	}
	u, err := url.Parse(flagValue(args, want.role+"-url"))
	_, port, _ := strings.Cut(flagValue(s.Command, want.listen), ":")
	if err != nil || u.Port() == "" || u.Port() != port {
		t.Errorf("%s: healthcheck --%s-url %q does not reach the service's --%s port %q", service, want.role, flagValue(args, want.role+"-url"), want.listen, port)
	}
	if slices.Contains(flags, "token-file") {
		t.Errorf("%s: the healthcheck needs no token (--health-only)", service)
	}
	return flags
}

// flagValue is the value given to --name in args, or to a short flag given as "-h" ("" when absent).
func flagValue(args []string, name string) string {
	if !strings.HasPrefix(name, "-") {
		name = "--" + name
	}
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// imageEntrypoint is the binary the image runs (its ENTRYPOINT in exec
// form), the one a healthcheck must call.
func imageEntrypoint(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(raw)) {
		if rest, ok := strings.CutPrefix(line, "ENTRYPOINT "); ok {
			var ep []string
			if err := json.Unmarshal([]byte(rest), &ep); err != nil || len(ep) != 1 {
				t.Fatalf("Dockerfile: ENTRYPOINT %s: want the binary alone in exec form", rest)
			}
			return ep[0]
		}
	}
	t.Fatal("Dockerfile has no ENTRYPOINT")
	return ""
}

// checkCommandLine parses args as the binary would and returns the
// command's path below the root and the flags given.
func checkCommandLine(t *testing.T, service string, args []string) (string, []string) {
	t.Helper()
	root := cmd.NewRoot()
	c, rest, err := root.Find(args)
	if err != nil || c == root {
		t.Errorf("%s: %q is no payouts command: %v", service, args, err)
		return "", nil
	}
	path := strings.TrimPrefix(c.CommandPath(), root.Name()+" ")
	if err := c.ParseFlags(rest); err != nil {
		t.Errorf("%s: `payouts %s`: %v", service, path, err)
		return path, nil
	}
	if extra := c.Flags().Args(); len(extra) > 0 {
		t.Errorf("%s: `payouts %s`: unexpected arguments %q", service, path, extra)
	}
	var given []string
	c.Flags().Visit(func(f *pflag.Flag) { given = append(given, f.Name) })
	return path, given
}

// TestComposePrometheusConfig checks the compose Prometheus configuration
// parses and scrapes every role under the job names the alerts use.
func TestComposePrometheusConfig(t *testing.T) {
	promtool := tool(t, "promtool")
	out, err := exec.Command(promtool, "check", "config", "--syntax-only", "prometheus/prometheus.yml").CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}
	raw, err := os.ReadFile("prometheus/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ScrapeConfigs []struct {
			JobName string `yaml:"job_name"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	var jobs []string
	for _, sc := range cfg.ScrapeConfigs {
		jobs = append(jobs, sc.JobName)
	}
	for _, role := range []string{"lock", "payment", "proxy", "rail", "executor", "reconcile"} {
		if !slices.Contains(jobs, "payouts-"+role) {
			t.Errorf("prometheus.yml does not scrape payouts-%s (jobs: %v)", role, jobs)
		}
	}
}

// TestComposeStateOnVolumes: a payouts role that keeps state on disk
// (--state-file) writes it under a named volume mounted in its service: the
// root filesystem is read-only, and anything else would be lost with the
// container. The rail stub keeps its payments so, as postgres keeps the
// payouts they paid for; otherwise a restarted stub makes every earlier
// payout read as posted but never settled. The reconciler keeps how far it
// reported the guards' safety events, so a restarted one does not page
// again for every event ever recorded.
func TestComposeStateOnVolumes(t *testing.T) {
	project := loadCompose(t)
	stateFiles := map[string]string{}
	for name, s := range project.Services {
		if !strings.HasPrefix(s.Image, "payouts:") {
			continue
		}
		for i, a := range s.Command {
			var path string
			switch {
			case a == "--state-file" && i+1 < len(s.Command):
				path = s.Command[i+1]
			case strings.HasPrefix(a, "--state-file="):
				path = strings.TrimPrefix(a, "--state-file=")
			default:
				continue
			}
			stateFiles[name] = path
			onVolume := false
			for _, v := range s.Volumes {
				if v.Type == types.VolumeTypeVolume && v.Source != "" && strings.HasPrefix(path, strings.TrimSuffix(v.Target, "/")+"/") {
					if _, declared := project.Volumes[v.Source]; !declared {
						t.Errorf("%s: volume %q is not declared", name, v.Source)
					}
					onVolume = true
				}
			}
			if !onVolume {
				t.Errorf("%s: --state-file %s is not under a named volume mounted in the service", name, path)
			}
		}
	}
	if !strings.HasPrefix(stateFiles["rail"], "/var/lib/payouts/") {
		t.Errorf("the rail stub keeps no state file under the image's /var/lib/payouts: %v", stateFiles)
	}
	if !strings.HasPrefix(stateFiles["reconciler"], "/var/lib/payouts/") {
		t.Errorf("the reconciler keeps no state file under the image's /var/lib/payouts: %v", stateFiles)
	}
}

// TestComposeEtcdAutoCompaction: every etcd member compacts its history.
// Deleting the grant log's keys does not shrink it, so without
// auto-compaction etcd's database grows to its quota, raises NOSPACE and
// refuses every write: the lock service grants nothing
// (docs/lock-service.md, "Bounded state").
func TestComposeEtcdAutoCompaction(t *testing.T) {
	project := loadCompose(t)
	for name, s := range project.Services {
		if !strings.Contains(s.Image, "etcd") {
			continue
		}
		setting := func(env, flag string) string {
			if v := flagValue(s.Command, flag); v != "" {
				return v
			}
			if v, ok := s.Environment[env]; ok && v != nil {
				return *v
			}
			return ""
		}
		if mode := setting("ETCD_AUTO_COMPACTION_MODE", "auto-compaction-mode"); mode != "periodic" {
			t.Errorf("%s: auto-compaction mode %q, want periodic (ETCD_AUTO_COMPACTION_MODE)", name, mode)
		}
		if r := setting("ETCD_AUTO_COMPACTION_RETENTION", "auto-compaction-retention"); r == "" || r == "0" {
			t.Errorf("%s: no auto-compaction retention (ETCD_AUTO_COMPACTION_RETENTION, e.g. 1h)", name)
		}
	}
}

// TestComposePostgresHealthcheck: pg_isready over TCP. Over the local
// socket it passes while the image's entrypoint runs its temporary
// initialization server (socket only), before the databases exist.
func TestComposePostgresHealthcheck(t *testing.T) {
	project := loadCompose(t)
	pg, ok := project.Services["postgres"]
	if !ok || pg.HealthCheck == nil {
		t.Fatal("compose has no postgres service with a healthcheck")
	}
	test := []string(pg.HealthCheck.Test)
	if h := flagValue(test, "-h"); !slices.Contains(test, "pg_isready") || (h != "127.0.0.1" && h != "localhost") {
		t.Errorf("postgres healthcheck %q: want pg_isready -h 127.0.0.1 (TCP, not the local socket)", test)
	}
}
