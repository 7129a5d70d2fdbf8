package obs

import (
	"runtime"
	"runtime/debug"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Stamped at build time by the Makefile:
//
//	-ldflags "-X github.com/payouts/payouts/internal/obs.version=v1.2.3 -X github.com/payouts/payouts/internal/obs.revision=<commit>"
//
// Without them the module version and the VCS settings Go records in the
// binary are used (go build records them unless -buildvcs=false).
var (
	version  string
	revision string
)

// BuildInfo says which build a process runs: what `payouts version` prints,
// what GET /version answers and what the payouts_build_info gauge carries.
type BuildInfo struct {
	Version  string `json:"version"`
	Revision string `json:"revision"`
	Go       string `json:"go"`
}

var build = sync.OnceValue(func() BuildInfo {
	b := BuildInfo{Version: version, Revision: revision, Go: runtime.Version()}
	info, ok := debug.ReadBuildInfo()
	if ok {
		if b.Version == "" && info.Main.Version != "" && info.Main.Version != "(devel)" {
			b.Version = info.Main.Version
		}
		if b.Revision == "" {
			modified := false
			for _, s := range info.Settings {
				switch s.Key {
				case "vcs.revision":
					b.Revision = s.Value
				case "vcs.modified":
					modified = s.Value == "true"
				}
			}
			if modified && b.Revision != "" {
				b.Revision += "-dirty"
			}
		}
	}
	if b.Version == "" {
		b.Version = "dev"
	}
	if b.Revision == "" {
		b.Revision = "unknown"
	}
	return b
})

// Build returns this binary's build information.
func Build() BuildInfo { return build() }

// newBuildInfoGauge is payouts_build_info{version,revision,goversion} = 1, so
// a dashboard can tell which build every role runs.
func newBuildInfoGauge(b BuildInfo) prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "payouts_build_info",
		Help: "Always 1; the labels say which build this process runs.",
	}, []string{"version", "revision", "goversion"})
	g.WithLabelValues(b.Version, b.Revision, b.Go).Set(1)
	return g
}
