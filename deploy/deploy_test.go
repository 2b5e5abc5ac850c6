// Package deploy_test checks the deploy files for what the operator relies on: the
// replicas, their health checks, the shutdown budget, secrets, and the alert rules
// (with promtool, where installed).
package deploy_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// handBack is what a worker may need after --shutdown-grace: cancelled orders hand
// their claims back within 10 s (a straggler's hand-back 5 s more each), and the HTTP
// servers get 5 s (cmd/certworker/run.go, queue/worker.go).
const handBack = 45 * time.Second

// node walks decoded YAML by keys and indexes.
type node struct{ v any }

func (n node) get(path ...any) node {
	v := n.v
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			s, _ := v.([]any)
			if k >= len(s) {
				return node{}
			}
			v = s[k]
		}
	}
	return node{v}
}

func (n node) str() string {
	if n.v == nil {
		return ""
	}
	switch v := n.v.(type) {
	case string:
		return v
	default:
		b, _ := yaml.Marshal(v)
		return strings.TrimSpace(string(b))
	}
}

func (n node) list() []node {
	s, _ := n.v.([]any)
	out := make([]node, len(s))
	for i, v := range s {
		out[i] = node{v}
	}
	return out
}

// docs decodes every YAML document of a file.
func docs(t *testing.T, path string) []node {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return decodeAll(t, b)
}

// decodeAll decodes every YAML document of b.
func decodeAll(t *testing.T, b []byte) []node {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var out []node
	for {
		var v map[string]any
		err := dec.Decode(&v)
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		out = append(out, node{v})
	}
}

func duration(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	require.NoError(t, err, s)
	return d
}

// envOf maps a container's env entries by name.
func envOf(c node) map[string]node {
	out := map[string]node{}
	for _, e := range c.get("env").list() {
		out[e.get("name").str()] = e
	}
	return out
}

// kubernetes is what `kubectl apply -k deploy/kubernetes` applies, by kind: every file
// kustomization.yaml lists (it must list every manifest but the example Secrets).
func kubernetes(t *testing.T) map[string][]node {
	t.Helper()
	k := docs(t, "kubernetes/kustomization.yaml")[0]
	listed := map[string]bool{}
	for _, r := range k.get("resources").list() {
		listed[r.str()] = true
	}
	files, err := filepath.Glob("kubernetes/*.yaml")
	require.NoError(t, err)
	byKind := map[string][]node{}
	for _, f := range files {
		base := filepath.Base(f)
		if base == "kustomization.yaml" || base == "secret.example.yaml" {
			continue
		}
		require.True(t, listed[base], "%s is not in kustomization.yaml's resources", base)
		for _, d := range docs(t, f) {
			byKind[d.get("kind").str()] = append(byKind[d.get("kind").str()], d)
		}
	}
	return byKind
}

// compose.yaml: PostgreSQL, a one-shot migrate after it, the grants after migrate,
// two run replicas after the grants, health-checked by `certworker healthcheck`,
// stopped with time for the hand-back.
func TestCompose(t *testing.T) {
	c := docs(t, "compose.yaml")[0]
	s := c.get("services")
	require.NotNil(t, s.get("postgres").v)
	require.Equal(t, "service_healthy", s.get("migrate", "depends_on", "postgres", "condition").str())
	require.Equal(t, "migrate", s.get("migrate", "command", 0).str())
	require.Equal(t, "no", s.get("migrate", "restart").str())

	w := s.get("certworker")
	require.Equal(t, "run", w.get("command", 0).str())
	require.Equal(t, "2", w.get("deploy", "replicas").str())
	require.Equal(t, "service_completed_successfully", w.get("depends_on", "grants", "condition").str(), "after migrate and the grants")
	require.Equal(t, []string{"CMD", "/usr/local/bin/certworker", "healthcheck"},
		[]string{w.get("healthcheck", "test", 0).str(), w.get("healthcheck", "test", 1).str(), w.get("healthcheck", "test", 2).str()})
	env := w.get("environment")
	require.NotContains(t, env.get("CERTWORKER_ADMIN_LISTEN").str(), "127.0.0.1")
	grace := duration(t, env.get("CERTWORKER_SHUTDOWN_GRACE").str())
	require.Greater(t, duration(t, w.get("stop_grace_period").str()), grace+handBack)
}

// deploy/kubernetes: the migrate Job, two replicas probed on /readyz and /healthz at
// an address the kubelet reaches, a termination grace longer than --shutdown-grace
// plus the hand-back, a PodDisruptionBudget over them, and secrets from a Secret.
func TestKubernetes(t *testing.T) {
	byKind := kubernetes(t)
	require.Len(t, byKind["Deployment"], 1)
	dep := byKind["Deployment"][0]
	require.Equal(t, "2", dep.get("spec", "replicas").str())
	pod := dep.get("spec", "template", "spec")
	c := pod.get("containers", 0)
	require.Equal(t, "run", c.get("args", 0).str())
	env := envOf(c)
	admin := env["CERTWORKER_ADMIN_LISTEN"].get("value").str()
	require.NotEmpty(t, admin)
	require.NotContains(t, admin, "127.0.0.1", "the kubelet cannot reach loopback")
	require.Equal(t, "/readyz", c.get("readinessProbe", "httpGet", "path").str())
	require.Equal(t, "/healthz", c.get("livenessProbe", "httpGet", "path").str())
	for _, probe := range []string{"readinessProbe", "livenessProbe"} {
		port := c.get(probe, "httpGet", "port").str()
		var found bool
		for _, p := range c.get("ports").list() {
			if p.get("name").str() == port {
				found = true
				require.True(t, strings.HasSuffix(admin, ":"+p.get("containerPort").str()), "%s probes %s, which is not --admin-listen %s", probe, port, admin)
			}
		}
		require.True(t, found, "%s: no port named %s", probe, port)
	}
	grace := duration(t, env["CERTWORKER_SHUTDOWN_GRACE"].get("value").str())
	termination := duration(t, pod.get("terminationGracePeriodSeconds").str()+"s")
	require.Greater(t, termination, grace+handBack)
	require.Equal(t, "certworker", env["CERTWORKER_DATABASE_URL"].get("valueFrom", "secretKeyRef", "name").str())

	require.Len(t, byKind["Job"], 1)
	job := byKind["Job"][0].get("spec", "template", "spec", "containers", 0)
	require.Equal(t, "migrate", job.get("args", 0).str())

	require.Len(t, byKind["PodDisruptionBudget"], 1)
	pdb := byKind["PodDisruptionBudget"][0]
	require.Equal(t, dep.get("spec", "selector").str(), pdb.get("spec", "selector").str())
	require.Equal(t, "1", pdb.get("spec", "minAvailable").str())

	var http01 bool
	for _, svc := range byKind["Service"] {
		if svc.get("spec", "ports", 0, "targetPort").str() == "http01" {
			http01 = true
			require.Equal(t, "80", svc.get("spec", "ports", 0, "port").str())
		}
	}
	require.True(t, http01, "no Service for the HTTP-01 responder")
}

// The alert rules, with their tests (alerts_test.yaml), through promtool (Debian's
// prometheus package; .ci/run installs it).
func TestAlertRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed (apt-get install prometheus)")
	}
	for _, args := range [][]string{{"check", "rules", "alerts.yaml"}, {"test", "rules", "alerts_test.yaml"}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
	}
}
