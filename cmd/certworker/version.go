package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/certworker/certworker"
)

// Set by the build (-ldflags "-X main.version=... -X main.commit=...") to override
// what the binary says of itself. Left empty, the version is the release's (VERSION)
// and the commit the one Go recorded when it built the binary in a checkout.
var (
	version string
	commit  string
)

// versionLine is what `certworker version` and `certworker --version` print.
func versionLine() string {
	return fmt.Sprintf("certworker %s (commit %s, %s)", releaseVersion(), buildCommit(), runtime.Version())
}

func releaseVersion() string {
	if version != "" {
		return version
	}
	return certworker.Version()
}

// buildCommit is -X main.commit when given; otherwise the revision `go build` stamped
// into the binary (vcs.revision, which any build in a git checkout has, -dirty added
// when the tree had changes: vcs.modified); otherwise "unknown" (built outside a
// checkout, or with -buildvcs=false).
func buildCommit() string {
	if commit != "" {
		return commit
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	return commitOf(info.Settings)
}

func commitOf(settings []debug.BuildSetting) string {
	var revision string
	var modified bool
	for _, s := range settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	switch {
	case revision == "":
		return "unknown"
	case modified:
		return revision + "-dirty"
	}
	return revision
}

// newBuildInfo is certworker_build_info: 1, labelled with what `certworker version`
// prints, so that a dashboard or an alert sees which release each instance runs.
func newBuildInfo() prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "certworker_build_info",
		Help:        "Always 1; its labels are the release's version, the commit it was built from and the Go version.",
		ConstLabels: prometheus.Labels{"version": releaseVersion(), "commit": buildCommit(), "go_version": runtime.Version()},
	})
	g.Set(1)
	return g
}
