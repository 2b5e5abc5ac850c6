package workertest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/internal/dnsresolver"
	"github.com/certworker/certworker/internal/pebbletest"
)

// StartResolver starts a dnsresolver forwarding to Pebble's DNS (challtestsrv), for
// the test's life: what a Pebble started with Options.DNSServer = its Addr, and a
// preflight, resolve names with.
func StartResolver(t testing.TB) *dnsresolver.Resolver {
	t.Helper()
	upstream, err := pebbletest.DNSAddress()
	if err != nil {
		t.Fatalf("pebble DNS: %v", err)
	}
	r, err := dnsresolver.Start(upstream)
	if err != nil {
		t.Fatalf("resolver: %v", err)
	}
	t.Cleanup(r.Close)
	return r
}

// ServeZone starts two instances' DNS-01 servers for zone on the database at dsn
// (each on a pool of its own), delegates zone to them in r, and returns their
// addresses.
func ServeZone(t testing.TB, r *dnsresolver.Resolver, dsn, zone string) []string {
	t.Helper()
	var addrs []string
	for range 2 {
		pool, err := pgxpool.New(context.Background(), dsn)
		if err != nil {
			t.Fatalf("pool: %v", err)
		}
		t.Cleanup(pool.Close)
		srv, err := acme.NewDNS01Server(pool, zap.NewNop(), acme.DNS01Options{Zone: zone, Nameservers: []string{"ns1." + zone}})
		if err != nil {
			t.Fatalf("DNS-01 server: %v", err)
		}
		pc, ln := ListenUDPAndTCP(t)
		if err := srv.Serve(pc, ln); err != nil {
			t.Fatalf("DNS-01 server: %v", err)
		}
		t.Cleanup(srv.Shutdown)
		addrs = append(addrs, ln.Addr().String())
	}
	r.Delegate(zone, addrs...)
	return addrs
}
