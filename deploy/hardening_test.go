package deploy_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker"
	"github.com/certworker/certworker/certstore/seal"
)

// memBytes reads a memory size as GOMEMLIMIT (B, KiB, MiB, GiB), Kubernetes (Ki, Mi,
// Gi) and compose (k, m, g, binary) write it.
func memBytes(t *testing.T, s string) int64 {
	t.Helper()
	m := regexp.MustCompile(`^([0-9]+)([A-Za-z]*)$`).FindStringSubmatch(strings.TrimSpace(s))
	require.NotNil(t, m, "memory size %q", s)
	n, err := strconv.ParseInt(m[1], 10, 64)
	require.NoError(t, err)
	unit := map[string]int64{"": 1, "B": 1, "b": 1,
		"KiB": 1 << 10, "Ki": 1 << 10, "k": 1 << 10,
		"MiB": 1 << 20, "Mi": 1 << 20, "m": 1 << 20,
		"GiB": 1 << 30, "Gi": 1 << 30, "g": 1 << 30}
	u, ok := unit[m[2]]
	require.True(t, ok, "unit of %q", s)
	return n * u
}

// GOMEMLIMIT leaves room under a hard limit: at most 80% of it (the runtime does not
// count the binary or the kernel's socket buffers), and not so low that the garbage
// collector runs all the time.
func requireMemLimitFits(t *testing.T, where, gomemlimit string, limit int64) {
	t.Helper()
	soft := memBytes(t, gomemlimit)
	require.LessOrEqual(t, soft, limit*8/10, "%s: GOMEMLIMIT %s leaves too little of %d bytes", where, gomemlimit, limit)
	require.GreaterOrEqual(t, soft, limit/2, "%s: GOMEMLIMIT %s is far below the limit %d", where, gomemlimit, limit)
}

// The worker pods hold no Kubernetes API token (certworker never calls the API), the
// image is the release's version (VERSION) pulled only when missing (a locally
// loaded image works; latest would be pulled on every start), and GOMEMLIMIT sits
// under the memory limit. Guards against a token in every pod, a deployment that
// cannot start from a local build, and manifests of another release than the binary.
func TestKubernetes_PodsHoldNoTokenAndUseTheReleasesImage(t *testing.T) {
	t.Parallel()
	byKind := kubernetes(t)
	k := docs(t, "kubernetes/kustomization.yaml")[0]
	var tag string
	for _, img := range k.get("images").list() {
		if img.get("name").str() == "certworker" {
			tag = img.get("newTag").str()
		}
	}
	require.Equal(t, certworker.Version(), tag, "kustomization.yaml tags certworker with VERSION")

	dep := byKind["Deployment"][0].get("spec", "template", "spec")
	job := byKind["Job"][0].get("spec", "template", "spec")
	for name, pod := range map[string]node{"Deployment": dep, "Job": job} {
		require.Equal(t, "false", pod.get("automountServiceAccountToken").str(), name)
		c := pod.get("containers", 0)
		require.Equal(t, "certworker", c.get("image").str(), "%s: the tag is kustomization.yaml's", name)
		require.Equal(t, "IfNotPresent", c.get("imagePullPolicy").str(), name)
	}
	c := dep.get("containers", 0)
	requireMemLimitFits(t, "deployment.yaml", envOf(c)["GOMEMLIMIT"].get("value").str(),
		memBytes(t, c.get("resources", "limits", "memory").str()))
}

// requireKeyFileMounted requires pod (a pod spec) to read the key encryption key from
// a file (never the environment), mounted read-only from the certworker Secret,
// readable by the pod's group alone.
func requireKeyFileMounted(t *testing.T, pod, securityContext node) {
	t.Helper()
	c := pod.get("containers", 0)
	env := envOf(c)
	require.NotContains(t, env, "CERTWORKER_KEY_ENCRYPTION_KEY", "the key is not in the environment")
	path := env["CERTWORKER_KEY_ENCRYPTION_KEY_FILE"].get("value").str()
	require.NotEmpty(t, path)
	var mounted bool
	for _, m := range c.get("volumeMounts").list() {
		if strings.HasPrefix(path, m.get("mountPath").str()+"/") {
			mounted = true
			require.Equal(t, "true", m.get("readOnly").str())
			var vol node
			for _, v := range pod.get("volumes").list() {
				if v.get("name").str() == m.get("name").str() {
					vol = v
				}
			}
			require.Equal(t, "certworker", vol.get("secret", "secretName").str())
			require.Equal(t, "key-encryption-key", vol.get("secret", "items", 0, "key").str())
			require.Equal(t, "key-encryption-key", vol.get("secret", "items", 0, "path").str())
			require.True(t, strings.HasSuffix(path, "/key-encryption-key"))
			// Readable by the pod's group (fsGroup), by nobody else.
			require.Equal(t, "288", vol.get("secret", "defaultMode").str(), "mode 0440")
			require.Equal(t, securityContext.get("runAsUser").str(), securityContext.get("fsGroup").str())
		}
	}
	require.True(t, mounted, "no volume mounted at %s", path)
}

// deploy/kubernetes leaves key sealing off as shipped: the Deployment names no key and
// mounts none, and kustomization.yaml adds no component. The sealing component,
// once added, mounts the key as a file from the certworker Secret; rendered by
// kubectl (where installed), the Deployment then reads it. Guards against manifests
// that seal from the first key stored, which today's proxy cannot read
// (docs/migrating-from-rust.md, "Sealing the keys"), and against a sealing that puts
// the key in the environment.
func TestKubernetes_SealingIsOffUntilTheOperatorAddsTheSealingComponent(t *testing.T) {
	t.Parallel()
	dep := kubernetes(t)["Deployment"][0].get("spec", "template", "spec")
	env := envOf(dep.get("containers", 0))
	require.NotContains(t, env, "CERTWORKER_KEY_ENCRYPTION_KEY")
	require.NotContains(t, env, "CERTWORKER_KEY_ENCRYPTION_KEY_FILE")
	require.Nil(t, dep.get("volumes").v, "the shipped Deployment mounts no key")
	require.Nil(t, docs(t, "kubernetes/kustomization.yaml")[0].get("components").v, "sealing is on as shipped")

	component := docs(t, "kubernetes/sealing/kustomization.yaml")[0]
	require.Equal(t, "Component", component.get("kind").str())
	require.Equal(t, "deployment-patch.yaml", component.get("patches", 0, "path").str())
	patch := docs(t, "kubernetes/sealing/deployment-patch.yaml")[0]
	require.Equal(t, "certworker", patch.get("metadata", "name").str())
	require.Equal(t, "certworker", patch.get("spec", "template", "spec", "containers", 0, "name").str())
	requireKeyFileMounted(t, patch.get("spec", "template", "spec"), dep.get("securityContext"))

	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not installed: the component is not rendered")
	}
	dir := filepath.Join(t.TempDir(), "kubernetes")
	require.NoError(t, os.CopyFS(dir, os.DirFS("kubernetes")))
	f, err := os.OpenFile(filepath.Join(dir, "kustomization.yaml"), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString("components:\n  - sealing\n")
	require.NoError(t, err)
	require.NoError(t, f.Close())
	out, err := exec.Command(kubectl, "kustomize", dir).Output()
	require.NoError(t, err)
	var rendered node
	for _, d := range decodeAll(t, out) {
		if d.get("kind").str() == "Deployment" {
			rendered = d.get("spec", "template", "spec")
		}
	}
	requireKeyFileMounted(t, rendered, rendered.get("securityContext"))
	renderedEnv := envOf(rendered.get("containers", 0))
	for name := range env {
		require.Contains(t, renderedEnv, name, "the patch dropped %s", name)
	}
}

// DNS-01 can be deployed from the plain manifests: the image exposes 5353 over UDP
// and TCP (where it listens, CERTWORKER_DNS01_LISTEN), the pods declare both, a
// Service maps UDP and TCP 53 to them, and the NetworkPolicy lets both in from
// anywhere (the CA's resolvers). Guards against a zone that no query can reach, as
// before: no Service, the policy blocking it, the image not exposing it.
func TestKubernetes_DNS01IsDeployable(t *testing.T) {
	t.Parallel()
	dockerfile := readText(t, "Dockerfile")
	require.Regexp(t, `(?m)^ENV[^\n]*(\\\n[^\n]*)*CERTWORKER_DNS01_LISTEN=:5353`, dockerfile)
	require.Regexp(t, `(?m)^EXPOSE .*\b5353/udp\b`, dockerfile)
	require.Regexp(t, `(?m)^EXPOSE .*\b5353/tcp\b`, dockerfile)

	byKind := kubernetes(t)
	c := byKind["Deployment"][0].get("spec", "template", "spec", "containers", 0)
	require.NotContains(t, envOf(c), "CERTWORKER_DNS01_LISTEN", "the image's :5353 stands")
	require.Contains(t, envOf(c), "CERTWORKER_DNS01_ZONE", "the operator's place to turn DNS-01 on")
	ports := map[string]node{}
	for _, p := range c.get("ports").list() {
		ports[p.get("name").str()] = p
	}
	want := map[string]string{"UDP": "dns01-udp", "TCP": "dns01-tcp"}
	for proto, name := range want {
		require.Equal(t, "5353", ports[name].get("containerPort").str(), name)
		require.Equal(t, proto, ports[name].get("protocol").str(), name)
	}

	var svc node
	for _, s := range byKind["Service"] {
		if s.get("metadata", "name").str() == "certworker-dns01" {
			svc = s
		}
	}
	require.NotNil(t, svc.v, "no certworker-dns01 Service")
	require.Equal(t, byKind["Deployment"][0].get("spec", "selector", "matchLabels").str(), svc.get("spec", "selector").str())
	got := map[string]string{}
	for _, p := range svc.get("spec", "ports").list() {
		require.Equal(t, "53", p.get("port").str())
		got[p.get("protocol").str()] = p.get("targetPort").str()
	}
	require.Equal(t, want, got)

	open := map[string]string{}
	for _, r := range byKind["NetworkPolicy"][0].get("spec", "ingress").list() {
		if r.get("from").v != nil {
			continue
		}
		for _, p := range r.get("ports").list() {
			open[p.get("port").str()] = p.get("protocol").str()
		}
	}
	for proto, name := range want {
		require.Equal(t, proto, open[name], "the NetworkPolicy does not let %s in", name)
	}
}

// The migrate Job's URL (the tables' owner) is in a Secret of its own, which no
// worker pod references, and the workers' Secret holds no owner URL. Guards against
// every worker pod carrying the owner's password.
func TestKubernetes_MigrateOwnerURLIsInASecretOfItsOwn(t *testing.T) {
	t.Parallel()
	byKind := kubernetes(t)
	job := byKind["Job"][0].get("spec", "template", "spec", "containers", 0)
	jobSecret := envOf(job)["CERTWORKER_DATABASE_URL"].get("valueFrom", "secretKeyRef", "name").str()
	require.NotEmpty(t, jobSecret)

	dep := byKind["Deployment"][0].get("spec", "template", "spec")
	workerSecrets := map[string]bool{}
	for _, e := range envOf(dep.get("containers", 0)) {
		if name := e.get("valueFrom", "secretKeyRef", "name").str(); name != "" {
			workerSecrets[name] = true
		}
	}
	for _, v := range dep.get("volumes").list() {
		if name := v.get("secret", "secretName").str(); name != "" {
			workerSecrets[name] = true
		}
	}
	require.NotEmpty(t, workerSecrets)
	require.NotContains(t, workerSecrets, jobSecret, "the workers can read the owner's URL")

	// The example Secrets say the same: the owner's URL only in the Job's.
	examples := map[string]node{}
	for _, d := range docs(t, "kubernetes/secret.example.yaml") {
		examples[d.get("metadata", "name").str()] = d
	}
	require.Contains(t, examples, jobSecret)
	require.Contains(t, examples[jobSecret].get("stringData", "database-url").str(), "proxy_owner")
	for name := range workerSecrets {
		require.Contains(t, examples, name)
		for key, v := range examples[name].get("stringData").v.(map[string]any) {
			require.NotContains(t, v, "proxy_owner", "%s/%s", name, key)
		}
	}
}

// The NetworkPolicy selects the worker pods, leaves the responder open (the CA comes
// from anywhere), and admits to the admin port only pods selected as Prometheus.
// Guards against /metrics open to every pod of the cluster, and against a policy
// that would cut the CA off.
func TestKubernetes_NetworkPolicyAdmitsOnlyPrometheusToTheAdminPort(t *testing.T) {
	t.Parallel()
	byKind := kubernetes(t)
	require.Len(t, byKind["NetworkPolicy"], 1)
	np := byKind["NetworkPolicy"][0].get("spec")
	dep := byKind["Deployment"][0]
	require.Equal(t, dep.get("spec", "selector", "matchLabels").str(), np.get("podSelector", "matchLabels").str())
	require.Equal(t, "Ingress", np.get("policyTypes", 0).str())

	ports := map[string]string{}
	for _, p := range dep.get("spec", "template", "spec", "containers", 0, "ports").list() {
		ports[p.get("name").str()] = p.get("containerPort").str()
	}
	rules := np.get("ingress").list()
	require.Len(t, rules, 2)
	var responderOpen, adminFromPrometheus bool
	for _, r := range rules {
		for _, p := range r.get("ports").list() {
			port := p.get("port").str()
			require.Contains(t, ports, port, "a rule names a port the container does not have")
			switch port {
			case "http01":
				require.Nil(t, r.get("from").v, "the responder is open to the CA, from anywhere")
				responderOpen = true
			case "admin":
				from := r.get("from").list()
				require.Len(t, from, 1)
				require.Equal(t, "prometheus", from[0].get("podSelector", "matchLabels", "app.kubernetes.io/name").str())
				require.NotNil(t, from[0].get("podSelector").v, "only selected pods")
				adminFromPrometheus = true
			}
		}
	}
	require.True(t, responderOpen)
	require.True(t, adminFromPrometheus)
}

// Compose runs migrate as the tables' owner, then a one-shot that creates the
// workers' role and applies grants.sql to it, and the workers under that role, with
// the key from a mounted secret file and GOMEMLIMIT under their memory limit. Guards
// against workers running as the superuser, and a key in `docker inspect`.
func TestCompose_WorkersRunUnderTheGrantsRoleWithAKeyFile(t *testing.T) {
	t.Parallel()
	c := docs(t, "compose.yaml")[0]
	s := c.get("services")
	userOf := func(url string) string {
		m := regexp.MustCompile(`^postgres://([^:@]+)[:@]`).FindStringSubmatch(url)
		require.NotNil(t, m, url)
		return m[1]
	}
	require.Equal(t, "postgres", userOf(s.get("migrate", "environment", "CERTWORKER_DATABASE_URL").str()))

	g := s.get("grants")
	require.Equal(t, "service_completed_successfully", g.get("depends_on", "migrate", "condition").str())
	require.Equal(t, "no", g.get("restart").str())
	require.Contains(t, g.get("volumes").list()[0].str(), "./grants.sql:/grants.sql")
	script := g.get("command", 0).str()
	require.Contains(t, script, "CREATE ROLE certworker_run")
	require.Contains(t, script, "-v role=certworker_run -f /grants.sql")
	require.Contains(t, script, "ON_ERROR_STOP=1")

	w := s.get("certworker")
	env := w.get("environment")
	require.Equal(t, "certworker_run", userOf(env.get("CERTWORKER_DATABASE_URL").str()))
	require.Equal(t, "service_completed_successfully", w.get("depends_on", "grants", "condition").str())
	require.Nil(t, env.get("CERTWORKER_KEY_ENCRYPTION_KEY").v, "the key is not in the environment")
	require.Equal(t, "/run/secrets/key-encryption-key", env.get("CERTWORKER_KEY_ENCRYPTION_KEY_FILE").str())
	require.Equal(t, "key-encryption-key", w.get("secrets", 0).str())
	require.NotEmpty(t, c.get("secrets", "key-encryption-key", "file").str())
	requireMemLimitFits(t, "compose.yaml", env.get("GOMEMLIMIT").str(), memBytes(t, w.get("mem_limit").str()))
}

// .env.example sets every variable compose.yaml requires (${VAR:?...}), so that
// `cp deploy/.env.example deploy/.env` is all a fresh shell needs; with it, and
// nothing in the environment, docker-compose parses the file (where installed).
// Guards against runbook commands that fail with "set POSTGRES_PASSWORD" unless the
// shell happens to export it.
func TestCompose_EnvExampleSetsEveryRequiredVariable(t *testing.T) {
	t.Parallel()
	compose, err := os.ReadFile("compose.yaml")
	require.NoError(t, err)
	required := map[string]bool{}
	for _, m := range regexp.MustCompile(`\$\{([A-Z0-9_]+):\?`).FindAllStringSubmatch(string(compose), -1) {
		required[m[1]] = true
	}
	require.Contains(t, required, "POSTGRES_PASSWORD")
	require.Contains(t, required, "CERTWORKER_DB_PASSWORD")

	f, err := os.Open(".env.example")
	require.NoError(t, err)
	defer f.Close()
	set := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		require.True(t, ok, "%q is not NAME=VALUE", line)
		set[k] = v
	}
	require.NoError(t, sc.Err())
	for name := range required {
		require.NotEmpty(t, set[name], ".env.example does not set %s", name)
	}
	require.NotContains(t, set, "CERTWORKER_KEY_ENCRYPTION_KEY", "the key goes in a file, not in .env")

	dc, err := exec.LookPath("docker-compose")
	if err != nil {
		t.Skip("docker-compose is not installed")
	}
	cmd := exec.Command(dc, "-f", "compose.yaml", "--env-file", ".env.example", "config", "-q")
	// A fresh shell: none of compose's variables set.
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); !strings.HasPrefix(name, "CERTWORKER_") && name != "POSTGRES_PASSWORD" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "docker-compose config: %s", out)
}

// The image sets GOMEMLIMIT, at the value the deploy files use. Guards against a
// container whose heap grows to the hard limit before the garbage collector minds.
func TestImage_SetsGOMEMLIMIT(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("Dockerfile")
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^\s*(?:ENV\s+)?(?:[A-Z0-9_]+=\S+\s+\\\s*\n\s*)*GOMEMLIMIT=(\S+)`).FindSubmatch(b)
	require.NotNil(t, m, "the Dockerfile sets no GOMEMLIMIT")
	requireMemLimitFits(t, "Dockerfile", string(m[1]), 256<<20)
	dep := kubernetes(t)["Deployment"][0].get("spec", "template", "spec", "containers", 0)
	require.Equal(t, string(m[1]), envOf(dep)["GOMEMLIMIT"].get("value").str())
}

// The image keeps the contract's admin address, loopback: it sets no
// CERTWORKER_ADMIN_LISTEN, while compose and Kubernetes, whose probes and Prometheus
// need it on every interface, set :9090 themselves. Guards against an image that
// exposes /metrics to whatever network a container is started on.
func TestImage_AdminListensOnLoopbackUnlessTheDeploymentSaysSo(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("Dockerfile")
	require.NoError(t, err)
	require.NotRegexp(t, `(?m)^[^#]*CERTWORKER_ADMIN_LISTEN`, string(b), "the image sets the admin address")
	require.Equal(t, ":9090", docs(t, "compose.yaml")[0].get("services", "certworker", "environment", "CERTWORKER_ADMIN_LISTEN").str())
	dep := kubernetes(t)["Deployment"][0].get("spec", "template", "spec", "containers", 0)
	require.Equal(t, ":9090", envOf(dep)["CERTWORKER_ADMIN_LISTEN"].get("value").str())
}

// keyFileCommands are the compose quickstart's lines that make the key file, from
// docs/running.md's code blocks: every line naming deploy/secrets/key-encryption-key.
func keyFileCommands(t *testing.T) []string {
	t.Helper()
	var lines []string
	inBlock := false
	for _, line := range strings.Split(readText(t, filepath.Join(docsRoot, "docs", "running.md")), "\n") {
		switch {
		case strings.HasPrefix(line, "```"):
			inBlock = !inBlock
		case inBlock && strings.Contains(line, "deploy/secrets/key-encryption-key"):
			lines = append(lines, line)
		}
	}
	require.Len(t, lines, 2, "docs/running.md's quickstart makes the key file in two lines")
	return lines
}

// The quickstart's key-file lines are the same in docs/running.md, compose.yaml and
// .env.example, and make a file only the workers' uid may read, as `run` requires
// (seal.ReadKeyringFile): umask 077 and owned by 65532. Run as written (as root, for
// the chown; `sudo` stands for itself where it is not installed), they make a key
// file of one key, mode 0600, owned by 65532. Guards against the instructions of old
// (umask 022: mode 0644, readable by every account on the host), which `run`
// refuses with exit 2, left in running.md and .env.example after compose.yaml's
// were fixed. deploy/smoke.sh runs the same lines and starts the image with the file.
func TestCompose_WritesTheKeyFileForItsReaderOnly(t *testing.T) {
	t.Parallel()
	lines := keyFileCommands(t)
	require.Contains(t, lines[0], "(umask 077; openssl rand -base64 32 > deploy/secrets/key-encryption-key)")
	require.Contains(t, lines[1], "chown 65532:65532 deploy/secrets/key-encryption-key")
	for _, file := range []string{"compose.yaml", ".env.example", filepath.Join(docsRoot, "docs", "running.md")} {
		text := readText(t, file)
		for _, line := range lines {
			require.Contains(t, text, line, "%s does not make the key file as docs/running.md does", file)
		}
		require.NotContains(t, text, "umask 022", file)
	}

	if os.Geteuid() != 0 {
		t.Skip("the chown to uid 65532 needs root")
	}
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("openssl is not installed")
	}
	dir := t.TempDir()
	script := "set -e\ncommand -v sudo >/dev/null || sudo() { \"$@\"; }\n" + strings.Join(lines, "\n") + "\n"
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	path := filepath.Join(dir, "deploy", "secrets", "key-encryption-key")
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	require.Equal(t, uint32(65532), fi.Sys().(*syscall.Stat_t).Uid)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	keys, err := seal.ParseKeyring(strings.TrimSpace(string(b)))
	require.NoError(t, err)
	require.Len(t, keys, 1)
}

// The migrate Job is named after the release, from kustomization.yaml's version label
// (VERSION): applying the next release's manifests creates a Job of its own, where a
// Job of one name would be refused (its template cannot change) until deleted by
// hand. Rendered by kubectl where installed. Guards against an upgrade that needs a
// hand step before `kubectl apply -k`.
func TestKubernetes_TheMigrateJobIsNamedAfterTheRelease(t *testing.T) {
	t.Parallel()
	k := docs(t, "kubernetes/kustomization.yaml")[0]
	var version string
	for _, l := range k.get("labels").list() {
		if v := l.get("pairs", "app.kubernetes.io/version").str(); v != "" {
			version = v
		}
	}
	require.Equal(t, certworker.Version(), version, "kustomization.yaml labels the release with VERSION")
	r := k.get("replacements", 0)
	require.Equal(t, "metadata.labels.[app.kubernetes.io/version]", r.get("source", "fieldPath").str())
	require.Equal(t, "Job", r.get("targets", 0, "select", "kind").str())
	require.Equal(t, "metadata.name", r.get("targets", 0, "fieldPaths", 0).str())

	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not installed: the manifests are not rendered")
	}
	out, err := exec.Command(kubectl, "kustomize", "kubernetes").Output()
	require.NoError(t, err)
	var jobs []string
	for _, d := range decodeAll(t, out) {
		if d.get("kind").str() == "Job" {
			jobs = append(jobs, d.get("metadata", "name").str())
			require.Equal(t, "certworker:"+certworker.Version(), d.get("spec", "template", "spec", "containers", 0, "image").str())
		}
	}
	require.Equal(t, []string{"certworker-migrate-" + certworker.Version()}, jobs)
}
