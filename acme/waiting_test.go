package acme_test

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/queue/issuing"
)

// A waiting name's check probes over HTTP only when the DNS answer changed from the
// one the last check saw, and, with --dns-target, only when the answer matches it;
// otherwise it says so without connecting, and an unchanged answer leaves the tenant's
// message alone (no Msg). Once the name answers the probe, the check passes. Guards
// against 100,000 stale names each costing an HTTP probe every check.
func TestCheckDNS_ProbesOnlyWhenTheAnswerChangedAndMatchesTheTarget(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, false)
	name := randomName("check")
	pointAt(t, name, "127.0.0.2")
	conns := b.countConns(t, "127.0.0.2", http.NotFoundHandler())
	iss := newIssuer(t, b.pool, nil, preflightConfig(b))
	ctx := testCtx(t, time.Minute)

	err := iss.CheckDNS(ctx, name, "")
	var we *issuing.WaitingError
	require.True(t, errors.As(err, &we), "%v", err)
	require.Contains(t, we.Msg, "answered by something else at 127.0.0.2")
	require.Contains(t, we.Msg, "point "+name+" at this proxy's addresses")
	require.Equal(t, "127.0.0.2", we.Answer)
	require.Equal(t, int32(1), conns.Load(), "probed once")

	err = iss.CheckDNS(ctx, name, we.Answer)
	require.True(t, errors.As(err, &we), "%v", err)
	require.Empty(t, we.Msg, "nothing new for the tenant")
	require.Equal(t, int32(1), conns.Load(), "the answer did not change: no probe")

	cfg := preflightConfig(b)
	cfg.DNSTarget = "192.0.2.7,192.0.2.8"
	targeted := newIssuer(t, b.pool, nil, cfg)
	err = targeted.CheckDNS(ctx, name, "")
	require.True(t, errors.As(err, &we), "%v", err)
	require.Contains(t, we.Msg, name+" resolves to 127.0.0.2, not to 192.0.2.7, 192.0.2.8")
	require.Contains(t, we.Msg, "point "+name+" at 192.0.2.7, 192.0.2.8")
	require.Equal(t, int32(1), conns.Load(), "off target: no probe")

	pointAt(t, name, "127.0.0.1") // the bed's responder
	b.respond(t, b.pool, nil)
	require.NoError(t, iss.CheckDNS(ctx, name, we.Answer), "the answer changed and the probe passes")
	_, err = acme.ParseDNSTarget("proxy.example.net")
	require.NoError(t, err)
}
