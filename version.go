// Package certworker holds what the whole repository shares about a release: its
// version, written once, in VERSION.
package certworker

import (
	_ "embed"
	"strings"
)

//go:embed VERSION
var versionFile string

// Version is this release's version: VERSION, which the binary reports (`certworker
// version`), the Makefile tags images and releases with, and CHANGELOG.md's top
// release entry names (version_test.go holds the two together).
func Version() string { return strings.TrimSpace(versionFile) }
