package workertest

import (
	"net/url"
	"testing"

	"github.com/certworker/certworker/internal/netrelay"
)

// Relayed starts a relay to the server of dsn (a URL, as pgtest gives) and returns it
// with dsn pointed at it: an instance started on that dsn reaches the database only
// through the relay, and a test cuts it off alone while the rest of the fleet keeps
// its own connections.
func Relayed(t testing.TB, dsn string) (*netrelay.Relay, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("relayed dsn: %v", err)
	}
	r := netrelay.Start(t, u.Host)
	u.Host = r.Addr()
	return r, u.String()
}
