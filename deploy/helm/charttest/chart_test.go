package charttest

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// chartDir is the chart under test; repoRoot the repository, for VERSION and
// deploy/alerts.yaml.
const (
	chartDir = "../certworker"
	repoRoot = "../../.."
)

// dns01AndSealing turns on what the default values leave off: DNS-01, key sealing,
// and the Prometheus Operator's objects with the runbooks somewhere else.
var dns01AndSealing = map[string]any{
	"dns01": map[string]any{
		"enabled":     true,
		"zone":        "acme.certworker.example",
		"nameservers": []any{"ns1.certworker.example=192.0.2.53", "ns2.certworker.example"},
	},
	"keyEncryption":  map[string]any{"existingSecret": "certworker-keys"},
	"serviceMonitor": map[string]any{"enabled": true},
	"prometheusRule": map[string]any{"enabled": true, "runbookBaseURL": "https://docs.certworker.example/v0/"},
}

// rendered is a chart's objects, strictly decoded, by kind and name.
type rendered map[string]map[string]any

func (r rendered) get(t *testing.T, kind, name string) any {
	t.Helper()
	obj, ok := r[kind][name]
	require.True(t, ok, "no %s %s; rendered: %v", kind, name, r.names())
	return obj
}

func (r rendered) names() []string {
	var out []string
	for kind, byName := range r {
		for name := range byName {
			out = append(out, kind+"/"+name)
		}
	}
	return out
}

// newObject is the Go type of each kind the chart may render, by apiVersion and kind.
// A kind not listed fails the test: every object the chart renders is checked.
var newObject = map[string]func() any{
	"apps/v1/Deployment":                      func() any { return &appsv1.Deployment{} },
	"batch/v1/Job":                            func() any { return &batchv1.Job{} },
	"v1/Service":                              func() any { return &corev1.Service{} },
	"policy/v1/PodDisruptionBudget":           func() any { return &policyv1.PodDisruptionBudget{} },
	"networking.k8s.io/v1/NetworkPolicy":      func() any { return &networkingv1.NetworkPolicy{} },
	"monitoring.coreos.com/v1/ServiceMonitor": func() any { return &monitoringv1.ServiceMonitor{} },
	"monitoring.coreos.com/v1/PrometheusRule": func() any { return &monitoringv1.PrometheusRule{} },
}

// decodeStrict decodes one YAML document into the Go type of its kind, refusing any
// field the type does not have (a misspelt or misplaced key that the API server
// would drop, or reject, is an error here).
func decodeStrict(doc []byte) (kind, name string, obj any, err error) {
	var tm struct {
		metav1.TypeMeta `json:",inline"`
		Metadata        metav1.ObjectMeta `json:"metadata"`
	}
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return "", "", nil, err
	}
	mk, ok := newObject[tm.APIVersion+"/"+tm.Kind]
	if !ok {
		return "", "", nil, &unknownKindError{tm.APIVersion + "/" + tm.Kind}
	}
	obj = mk()
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return "", "", nil, err
	}
	return tm.Kind, tm.Metadata.Name, obj, nil
}

type unknownKindError struct{ kind string }

func (e *unknownKindError) Error() string { return "no Go type for " + e.kind }

var docSeparator = regexp.MustCompile(`(?m)^---\s*$`)

// render renders the chart as `helm install --dry-run` (client only) does, with
// values over the defaults, hooks included, and decodes every object strictly.
func render(t *testing.T, values map[string]any) (rendered, error) {
	t.Helper()
	chart, err := loader.Load(chartDir)
	require.NoError(t, err)
	install := action.NewInstall(&action.Configuration{})
	install.DryRun = true
	install.ClientOnly = true
	install.Replace = true
	install.ReleaseName = "certworker"
	install.Namespace = "certworker"
	install.KubeVersion = &chartutil.KubeVersion{Version: "v1.30.0", Major: "1", Minor: "30"}
	rel, err := install.Run(chart, values)
	if err != nil {
		return nil, err
	}
	manifests := []string{rel.Manifest}
	for _, h := range rel.Hooks {
		manifests = append(manifests, h.Manifest)
	}
	out := rendered{}
	for _, m := range manifests {
		for _, doc := range docSeparator.Split(m, -1) {
			if len(bytes.TrimSpace(stripComments(doc))) == 0 {
				continue
			}
			kind, name, obj, err := decodeStrict([]byte(doc))
			require.NoError(t, err, "%s", doc)
			if out[kind] == nil {
				out[kind] = map[string]any{}
			}
			require.NotContains(t, out[kind], name, "two %s named %s", kind, name)
			out[kind][name] = obj
		}
	}
	return out, nil
}

// stripComments drops YAML comment lines (Helm heads each template's output with
// "# Source: ...").
func stripComments(doc string) []byte {
	var b bytes.Buffer
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.Bytes()
}

func version(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "VERSION"))
	require.NoError(t, err)
	return strings.TrimSpace(string(b))
}

func envOf(c corev1.Container) map[string]corev1.EnvVar {
	out := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		out[e.Name] = e
	}
	return out
}

// The strict decoding refuses an unknown field: without it every check below would
// pass on a misspelt key (replica: 2) that Kubernetes drops.
func TestChart_StrictDecodingRefusesUnknownFields(t *testing.T) {
	_, _, _, err := decodeStrict([]byte("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  replica: 2\n"))
	require.ErrorContains(t, err, `unknown field "replica"`)
	_, _, _, err = decodeStrict([]byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n"))
	require.ErrorContains(t, err, "no Go type for v1/ConfigMap")
	_, _, obj, err := decodeStrict([]byte("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  replicas: 2\n"))
	require.NoError(t, err)
	require.Equal(t, int32(2), *obj.(*appsv1.Deployment).Spec.Replicas)
}

// helm lint, strict (warnings fail too), passes with the default values and with
// DNS-01 and sealing on; the chart's version and appVersion are the release's.
func TestChart_Lints(t *testing.T) {
	for name, values := range map[string]map[string]any{"default": nil, "dns01 and sealing": dns01AndSealing} {
		lint := action.NewLint()
		lint.Strict = true
		lint.KubeVersion = &chartutil.KubeVersion{Version: "v1.30.0", Major: "1", Minor: "30"}
		result := lint.Run([]string{chartDir}, values)
		require.Empty(t, result.Errors, name)
		for _, m := range result.Messages {
			require.Less(t, m.Severity, support.WarningSev, "%s: %s", name, m)
		}
	}
	chart, err := loader.Load(chartDir)
	require.NoError(t, err)
	require.Equal(t, version(t), chart.Metadata.Version, "Chart.yaml's version is VERSION")
	require.Equal(t, version(t), chart.Metadata.AppVersion, "Chart.yaml's appVersion is VERSION")
}

// With the default values: the migrate Job is a pre-install and pre-upgrade hook that
// Helm deletes itself, named after the release (a Job per release where the chart is
// applied without Helm's hooks), the workers run the release's image with no key (sealing off)
// and no DNS-01, a PodDisruptionBudget covers them, the responder has its Service
// and the NetworkPolicy lets it in, and the Prometheus Operator's objects are off.
func TestChart_DefaultValues(t *testing.T) {
	objs, err := render(t, nil)
	require.NoError(t, err)

	job := objs.get(t, "Job", "certworker-migrate-"+version(t)).(*batchv1.Job)
	require.Equal(t, map[string]string{
		"helm.sh/hook":               "pre-install,pre-upgrade",
		"helm.sh/hook-weight":        "0",
		"helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded",
	}, job.Annotations)
	mc := job.Spec.Template.Spec.Containers[0]
	require.Equal(t, []string{"migrate"}, mc.Args)
	require.Equal(t, "certworker-migrate", envOf(mc)["CERTWORKER_DATABASE_URL"].ValueFrom.SecretKeyRef.Name)

	dep := objs.get(t, "Deployment", "certworker").(*appsv1.Deployment)
	pod := dep.Spec.Template.Spec
	c := pod.Containers[0]
	require.Equal(t, "certworker:"+version(t), c.Image)
	require.Equal(t, []string{"run"}, c.Args)
	env := envOf(c)
	require.Equal(t, "certworker", env["CERTWORKER_DATABASE_URL"].ValueFrom.SecretKeyRef.Name)
	require.NotContains(t, env, "CERTWORKER_KEY_ENCRYPTION_KEY_FILE", "sealing is off until a key is set")
	require.NotContains(t, env, "CERTWORKER_KEY_ENCRYPTION_KEY")
	require.NotContains(t, env, "CERTWORKER_DNS01_ZONE")
	require.Empty(t, pod.Volumes)
	require.False(t, *pod.AutomountServiceAccountToken)
	require.Equal(t, "/readyz", c.ReadinessProbe.HTTPGet.Path)
	require.Equal(t, "/healthz", c.LivenessProbe.HTTPGet.Path)

	pdb := objs.get(t, "PodDisruptionBudget", "certworker").(*policyv1.PodDisruptionBudget)
	require.Equal(t, dep.Spec.Selector.MatchLabels, pdb.Spec.Selector.MatchLabels)
	require.Equal(t, 1, pdb.Spec.MinAvailable.IntValue())

	http01 := objs.get(t, "Service", "certworker-http01").(*corev1.Service)
	require.Equal(t, int32(80), http01.Spec.Ports[0].Port)
	require.Equal(t, "http01", http01.Spec.Ports[0].TargetPort.String())
	require.NotContains(t, objs["Service"], "certworker-dns01")

	np := objs.get(t, "NetworkPolicy", "certworker").(*networkingv1.NetworkPolicy)
	require.Equal(t, map[string]corev1.Protocol{"http01": corev1.ProtocolTCP}, openPorts(np))

	require.Empty(t, objs["ServiceMonitor"])
	require.Empty(t, objs["PrometheusRule"])
}

// openPorts are the ports a NetworkPolicy lets in from anywhere, with their protocol.
func openPorts(np *networkingv1.NetworkPolicy) map[string]corev1.Protocol {
	out := map[string]corev1.Protocol{}
	for _, r := range np.Spec.Ingress {
		if len(r.From) > 0 {
			continue
		}
		for _, p := range r.Ports {
			out[p.Port.String()] = *p.Protocol
		}
	}
	return out
}

// With DNS-01 and sealing on: a Service maps UDP and TCP 53 to the pods' 5353, the
// NetworkPolicy lets both in, the workers answer the zone, and read the key
// encryption key from a file of the given Secret, mode 0440; the ServiceMonitor
// scrapes the admin Service, and the PrometheusRule holds deploy/alerts.yaml's
// alerts, each with a runbook_url under the given base.
func TestChart_DNS01AndSealing(t *testing.T) {
	objs, err := render(t, dns01AndSealing)
	require.NoError(t, err)

	dep := objs.get(t, "Deployment", "certworker").(*appsv1.Deployment)
	pod := dep.Spec.Template.Spec
	c := pod.Containers[0]
	env := envOf(c)
	require.Equal(t, "acme.certworker.example", env["CERTWORKER_DNS01_ZONE"].Value)
	require.Equal(t, "ns1.certworker.example=192.0.2.53,ns2.certworker.example", env["CERTWORKER_DNS01_NAMESERVERS"].Value)
	require.Equal(t, ":5353", env["CERTWORKER_DNS01_LISTEN"].Value)
	ports := map[string]corev1.ContainerPort{}
	for _, p := range c.Ports {
		ports[p.Name] = p
	}
	for name, proto := range map[string]corev1.Protocol{"dns01-udp": corev1.ProtocolUDP, "dns01-tcp": corev1.ProtocolTCP} {
		require.Equal(t, int32(5353), ports[name].ContainerPort, name)
		require.Equal(t, proto, ports[name].Protocol, name)
	}

	dns := objs.get(t, "Service", "certworker-dns01").(*corev1.Service)
	require.Equal(t, corev1.ServiceTypeLoadBalancer, dns.Spec.Type)
	require.Equal(t, dep.Spec.Selector.MatchLabels, dns.Spec.Selector)
	got := map[corev1.Protocol]string{}
	for _, p := range dns.Spec.Ports {
		require.Equal(t, int32(53), p.Port)
		got[p.Protocol] = p.TargetPort.String()
	}
	require.Equal(t, map[corev1.Protocol]string{corev1.ProtocolUDP: "dns01-udp", corev1.ProtocolTCP: "dns01-tcp"}, got)

	np := objs.get(t, "NetworkPolicy", "certworker").(*networkingv1.NetworkPolicy)
	require.Equal(t, map[string]corev1.Protocol{"http01": corev1.ProtocolTCP, "dns01-udp": corev1.ProtocolUDP, "dns01-tcp": corev1.ProtocolTCP}, openPorts(np))

	require.NotContains(t, env, "CERTWORKER_KEY_ENCRYPTION_KEY")
	path := env["CERTWORKER_KEY_ENCRYPTION_KEY_FILE"].Value
	require.Equal(t, "/etc/certworker/keys/key-encryption-key", path)
	require.Len(t, c.VolumeMounts, 1)
	require.Equal(t, filepath.Dir(path), c.VolumeMounts[0].MountPath)
	require.True(t, c.VolumeMounts[0].ReadOnly)
	require.Len(t, pod.Volumes, 1)
	secret := pod.Volumes[0].Secret
	require.Equal(t, "certworker-keys", secret.SecretName)
	require.Equal(t, []corev1.KeyToPath{{Key: "key-encryption-key", Path: "key-encryption-key"}}, secret.Items)
	require.Equal(t, int32(0o440), *secret.DefaultMode)
	require.Equal(t, *pod.SecurityContext.RunAsUser, *pod.SecurityContext.FSGroup)

	sm := objs.get(t, "ServiceMonitor", "certworker").(*monitoringv1.ServiceMonitor)
	selects := func(labels map[string]string) bool {
		for k, v := range sm.Spec.Selector.MatchLabels {
			if labels[k] != v {
				return false
			}
		}
		return true
	}
	for name, want := range map[string]bool{"certworker-admin": true, "certworker-http01": false, "certworker-dns01": false} {
		require.Equal(t, want, selects(objs.get(t, "Service", name).(*corev1.Service).Labels), "the ServiceMonitor selects %s", name)
	}
	require.Equal(t, "admin", sm.Spec.Endpoints[0].Port)
	require.Equal(t, "/metrics", sm.Spec.Endpoints[0].Path)

	rule := objs.get(t, "PrometheusRule", "certworker").(*monitoringv1.PrometheusRule)
	var alerts struct {
		Groups []monitoringv1.RuleGroup `json:"groups"`
	}
	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "alerts.yaml"))
	require.NoError(t, err)
	require.NoError(t, yaml.UnmarshalStrict(b, &alerts))
	require.Len(t, rule.Spec.Groups, len(alerts.Groups))
	n := 0
	for i, g := range rule.Spec.Groups {
		require.Equal(t, alerts.Groups[i].Name, g.Name)
		require.Len(t, g.Rules, len(alerts.Groups[i].Rules))
		for j, r := range g.Rules {
			want := alerts.Groups[i].Rules[j]
			require.Equal(t, want.Alert, r.Alert)
			require.Equal(t, want.Expr, r.Expr)
			require.Equal(t, want.Annotations["summary"], r.Annotations["summary"], "Prometheus's {{ }} templates pass through Helm untouched")
			require.Equal(t, "https://docs.certworker.example/v0/docs/runbook.md#"+strings.ToLower(r.Alert), r.Annotations["runbook_url"])
			n++
		}
	}
	require.GreaterOrEqual(t, n, 9)
}

// DNS-01 without its zone or name servers is refused at render time, naming them,
// rather than deploying workers that exit 2.
func TestChart_DNS01WithoutAZoneIsRefused(t *testing.T) {
	_, err := render(t, map[string]any{"dns01": map[string]any{"enabled": true}})
	require.ErrorContains(t, err, "dns01.enabled needs dns01.zone and dns01.nameservers")
}
