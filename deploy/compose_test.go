package deploy_test

import (
	"context"
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
var secretFlags = []string{"token", "rail-token", "insecure-no-auth"}

// TestComposeCommandLines parses every payouts command line in
// deploy/compose.yaml with the binary's own command tree, so a renamed or
// removed flag breaks this test rather than a deployment.
func TestComposeCommandLines(t *testing.T) {
	project := loadCompose(t)
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
	want := map[string]int{"serve lock": 2, "serve payment": 1, "serve proxy": 1, "serve rail": 1, "run executor": 2, "reconcile": 1}
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
