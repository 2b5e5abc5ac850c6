// Package charttest checks the Helm chart in deploy/helm/certworker with Helm's own
// packages: lint, then render, each rendered object decoded strictly into its
// Kubernetes or Prometheus Operator type. It is a module of its own so that Helm and
// the Kubernetes client libraries stay out of certworker's module and binary; `make
// test` runs it (a nested module is not part of the root's ./...).
package charttest
