package main

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/internal/workertest"
)

// run with --dns01-zone answers the zone on --dns01-listen over UDP and TCP (SOA and
// NS from --dns01-nameservers, REFUSED outside it) and records the zone, so that
// certworker_dns01_target gives the proxy the target the server answers. Guards
// against a zone flag that serves nothing, and a target function that stays NULL.
func TestRun_ServesTheDNS01ZoneAndRecordsIt(t *testing.T) {
	t.Parallel()
	bin := buildCertworker(t)
	pool, dsn := pgtest.NewPool(t)
	ca := pebbletest.StartT(t, pebbletest.Options{})
	dnsAddr := workertest.FreeAddr(t)
	cmd := exec.Command(bin, "run",
		"--database-url", dsn,
		"--acme-directory", ca.DirectoryURL,
		"--acme-ca-bundle", ca.RootsFile,
		"--preflight", "off",
		"--http01-listen", workertest.FreeAddr(t),
		"--admin-listen", "",
		"--dns01-zone", "acme.run-test.example",
		"--dns01-nameservers", "ns1.run-test.example,ns2.run-test.example",
		"--dns01-listen", dnsAddr)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	logs := &workertest.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	defer func() {
		if t.Failed() {
			t.Logf("certworker run's log:\n%s", logs)
		}
	}()

	ask := func(network, name string, qtype uint16) (*dns.Msg, error) {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), qtype)
		in, _, err := (&dns.Client{Net: network, Timeout: 2 * time.Second}).Exchange(m, dnsAddr)
		return in, err
	}
	require.Eventually(t, func() bool {
		in, err := ask("udp", "acme.run-test.example", dns.TypeSOA)
		return err == nil && in.Rcode == dns.RcodeSuccess && len(in.Answer) == 1
	}, time.Minute, 100*time.Millisecond, "the zone is not served")
	for _, network := range []string{"udp", "tcp"} {
		in, err := ask(network, "acme.run-test.example", dns.TypeNS)
		require.NoError(t, err)
		require.Len(t, in.Answer, 2, network)
		in, err = ask(network, "www.example.com", dns.TypeA)
		require.NoError(t, err)
		require.Equal(t, dns.RcodeRefused, in.Rcode, network)
	}
	var target *string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT certworker_dns01_target('Shop.Example')`).Scan(&target))
	require.NotNil(t, target)
	require.Equal(t, acme.DNS01Target("acme.run-test.example", "shop.example"), *target)
}
