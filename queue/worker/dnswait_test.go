package worker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/listener"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// tenantsDNS is a fake issuer that can check a waiting name's DNS
// (issuing.DNSChecker), over the tenants' DNS and web servers as the test sets them:
// a name is not pointed at the proxy (it waits) until the test points it (ready);
// a hostile name's DNS answer changes at every look, so every check runs the HTTP
// probe, and its web server accepts and never answers, so the probe holds its check
// until the check's bound.
type tenantsDNS struct {
	*fakeissuer.Issuer
	mu      sync.Mutex
	hostile map[string]bool
	ready   map[string]bool
	looks   int
	running map[string]int // checks running, by tenant
	most    map[string]int // the most running at once, by tenant
	tenant  map[string]string
	checked chan string // each check's name, once it returns
}

func newTenantsDNS() *tenantsDNS {
	d := &tenantsDNS{Issuer: fakeissuer.New(100), hostile: map[string]bool{}, ready: map[string]bool{},
		running: map[string]int{}, most: map[string]int{}, tenant: map[string]string{}, checked: make(chan string, 1000)}
	d.Fail = func(domain string, _ int) error {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.ready[domain] {
			return nil
		}
		return &issuing.WaitingError{Msg: "it does not point here", Answer: "first"}
	}
	return d
}

func (d *tenantsDNS) CheckDNS(ctx context.Context, domain, _ string) error {
	d.mu.Lock()
	d.looks++
	answer := fmt.Sprint("answer-", d.looks)
	hostile, ready, tenant := d.hostile[domain], d.ready[domain], d.tenant[domain]
	d.running[tenant]++
	d.most[tenant] = max(d.most[tenant], d.running[tenant])
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.running[tenant]--
		d.mu.Unlock()
		select {
		case d.checked <- domain:
		default:
		}
	}()
	switch {
	case ready:
		return nil
	case hostile:
		<-ctx.Done() // the probe of a web server that never answers
		return &issuing.WaitingError{Msg: "the probe timed out", Answer: answer}
	default:
		return &issuing.WaitingError{Answer: "first"}
	}
}

// One tenant's 24 waiting names, whose DNS answers change at every look and whose web
// servers accept and never answer, hold every check of theirs to its bound; another
// tenant's waiting name, pointed at the proxy just after one of its checks, is still
// ordered within one check interval, a tick, a check and a claim: under 3 s with the
// test's pace, a tenth of the real one (a 1 s gap between checks instead of 10 s),
// where the promise is 30 s. The hostile tenant never runs more than its share of
// checks at once. Guards against a waiter that takes the checks oldest first with no
// share per tenant, begins the next batch only when the slowest has ended, or claims
// a name whose check passed only when its batch ends.
func TestDNSWait_AnotherTenantsHungChecksDoNotDelayAName(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dns := newTenantsDNS()
	hog, other := b.tenant(t), b.tenant(t)
	for i := range 24 {
		name := fmt.Sprintf("hung-%d.hog.example", i)
		dns.hostile[name], dns.tenant[name] = true, hog
		b.named(t, hog, name)
	}
	const moving = "moving.other.example"
	dns.tenant[moving] = other
	id := b.named(t, other, moving)
	pace := worker.DNSWaitPace{Tick: 100 * time.Millisecond, First: time.Second, CheckTimeout: time.Second, Parallel: 8, Share: 4}
	b.start(t, "w", worker.Config{Issuer: dns, Concurrency: 8, PollInterval: time.Hour, DNSWait: pace})

	// Every name waits, and the hostile ones' checks are running.
	workertest.Eventually(t, 20*time.Second, "every name to wait for its DNS", func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM proxy_domains WHERE ssl_held = 'dns'`).Scan(&n))
		return n == 25
	})
	hungChecks := 0
	for hungChecks < 8 {
		select {
		case name := <-dns.checked:
			if dns.hostile[name] {
				hungChecks++
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the hostile names were not checked")
		}
	}
	// The move, just after a check of the moving name.
	for name := range dns.checked {
		if name == moving {
			break
		}
	}
	dns.mu.Lock()
	dns.ready[moving] = true
	dns.mu.Unlock()
	moved := time.Now()
	b.waitStatus(t, id, "active", 20*time.Second)
	took := time.Since(moved)
	t.Logf("ordered %s after the move", took.Round(10*time.Millisecond))
	require.Less(t, took, 3*time.Second, "ordered too late after its DNS moved")
	dns.mu.Lock()
	defer dns.mu.Unlock()
	require.LessOrEqual(t, dns.most[hog], pace.Share, "the hostile tenant ran more than its share of checks at once")
}

// A name waiting for days, checked next in an hour, is checked at once when the proxy
// reports a handshake for it (certworker_name_seen), then every check interval while
// the resolver still answers as before (1 s at the test's pace, a tenth of the real
// one: the state schedules each next check one interval after the last), and once the
// resolver's answer moves, the check that sees it brings the name back in line and
// it is ordered at once, not at the next poll (an hour here). How long the tick, the
// check and the claim take on a busy machine is the machine's; the promise of 15 s
// is the interval's 10 s and 5 s for them. Guards against a handshake that does not
// reach the waiter, and against a name checked once after it and then left to the
// slow pace.
func TestDNSWait_AHandshakeBringsAnOldWaitForward(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dns := newTenantsDNS()
	const name = "old.wait.example"
	dns.tenant[name] = b.tenant(t)
	id := b.named(t, dns.tenant[name], name)
	pace := worker.DNSWaitPace{Tick: 100 * time.Millisecond, First: time.Second, CheckTimeout: time.Second}
	in := b.start(t, "w", worker.Config{Issuer: dns, Concurrency: 1, PollInterval: time.Hour, DNSWait: pace})
	workertest.Eventually(t, 10*time.Second, "the name to wait for its DNS", func() bool {
		var held *string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT ssl_held FROM proxy_domains WHERE id = $1`, id).Scan(&held))
		return held != nil && *held == "dns"
	})
	_, err := b.pool.Exec(b.ctx, `UPDATE certworker_dns_state SET waiting_since = now() - interval '3 days',
    paced_since = now() - interval '3 days', next_check_at = now() + interval '1 hour' WHERE domain_id = $1`, id)
	require.NoError(t, err)
	for len(dns.checked) > 0 {
		<-dns.checked
	}

	var seen bool
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT certworker_name_seen($1)`, "OLD.wait.example.").Scan(&seen))
	require.True(t, seen)
	for range 2 { // the check the handshake brought forward, and the next one, 1 s on
		select {
		case <-dns.checked:
		case <-time.After(3 * time.Second):
			t.Fatal("the name was not checked after the handshake")
		}
	}
	// Between two checks (none running), the next is one interval after the last.
	var gap float64
	workertest.Eventually(t, 10*time.Second, "the state between two checks", func() bool {
		var taken bool
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT COALESCE(taken_until > now(), false), extract(epoch FROM next_check_at - updated_at)
FROM certworker_dns_state WHERE domain_id = $1`, id).Scan(&taken, &gap))
		return !taken
	})
	require.InDelta(t, pace.First.Seconds(), gap, 0.001, "the next check after the handshake's is not one interval on")

	dns.mu.Lock()
	dns.ready[name] = true
	dns.mu.Unlock()
	moved := time.Now()
	b.waitStatus(t, id, "active", 10*time.Second)
	t.Logf("ordered %s after the move", time.Since(moved).Round(10*time.Millisecond))
	sources := in.StartedWith(name)
	require.Equal(t, listener.SourceTimer, sources[len(sources)-1], "the order after the move was not the one the check's hand-back woke")
}
