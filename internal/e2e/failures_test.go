package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// caDownFor is how long TestE2E_ACADownIsNotCharged keeps the CA away. The issue asks
// for "a few minutes"; CI uses less (the backoff is capped at 30 s, so the catch-up
// after a longer outage is the same), and CERTWORKER_E2E_CA_DOWN sets it for a run by
// hand.
func caDownFor(t *testing.T) time.Duration {
	if v := os.Getenv("CERTWORKER_E2E_CA_DOWN"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err, "CERTWORKER_E2E_CA_DOWN")
		return d
	}
	return 20 * time.Second
}

// A CA that cannot be reached is the CA's problem, not the domains' (docs/cas.md, "Pauses"):
// with the CA down and domains due, no attempt is charged, ordering is paused for
// every instance on the CA's own backoff, nothing is left in 'provisioning', the
// worker goes on running and says what it sees (a line per change of state, a gauge),
// and every domain is issued within a minute of the CA's return. The reference-era
// worker charged an attempt per try, so a day's outage ended every pending domain
// 'failed'.
//
// Two ways of being down, both before the account exists (a CA down at the first
// start) and after a first certificate.
func TestE2E_ACADownIsNotCharged(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		before bool // a first certificate before the CA goes away
	}{{"from the start", false}, {"after a first certificate", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t, pebbletest.Options{})
			front := pebbletest.NewFront(t, w.ca)
			cfg := w.acmeConfig()
			cfg.DirectoryURL = front.DirectoryURL
			qcfg := issuing.Config{RetryBase: 200 * time.Millisecond, RetryMax: time.Minute, MaxAttempts: 3}
			in := w.startWorker(t, "w", cfg, worker.Config{Queue: qcfg, Concurrency: 4, PollInterval: 30 * time.Second})
			if tc.before {
				first := w.addDomains(t, randomName("before"))[0]
				waitFor(t, 30*time.Second, "a first certificate", func() bool { return w.domain(t, first).Status == "active" })
			}
			front.SetDown(true)
			s := startStateSampler(w, 20*time.Millisecond)
			names := []string{randomName("down"), randomName("down"), randomName("down"), randomName("down"), randomName("down")}
			ids := w.addDomains(t, names...)
			down := caDownFor(t)
			time.Sleep(down)
			require.Equal(t, 1.0, in.Metric(t, "certworker_ca_unreachable"), "the gauge does not say the CA is unreachable")
			var failures int
			require.NoError(t, w.pool.QueryRow(w.ctx, `
SELECT failures FROM certworker_pauses WHERE scope = 'ca' AND key = $1 AND source = 'unreachable'`, cfg.DirectoryURL).Scan(&failures))
			require.Positive(t, failures)

			front.SetDown(false)
			back := time.Now()
			waitFor(t, time.Minute, "every domain to be issued within a minute of the CA's return", func() bool {
				for _, id := range ids {
					if w.domain(t, id).Status != "active" {
						return false
					}
				}
				return true
			})
			t.Logf("CA down %s, %d tries found it unreachable; all %d domains issued %s after its return",
				down, failures, len(ids), time.Since(back).Round(time.Millisecond))
			states, err := s.stop()
			require.NoError(t, err)
			for i, id := range ids {
				require.Zero(t, states[id].maxAttempts, "%s was charged an attempt for the CA's outage", names[i])
				require.Empty(t, states[id].errors, "%s got an ssl_error for the CA's outage", names[i])
				require.Less(t, states[id].longestProvisioning, 5*time.Second, "%s stuck in provisioning", names[i])
			}
			require.True(t, in.Running())
			require.Equal(t, 1, in.Logs.FilterMessage("CA unreachable; ordering paused for every instance, nothing charged").Len(),
				"one line for the change of state, not one per try")
			require.Equal(t, 1, in.Logs.FilterMessage("CA reachable again; ordering resumes").Len())
			require.Equal(t, 0.0, in.Metric(t, "certworker_ca_unreachable"))
		})
	}
}

// A CA's rate limit pauses every instance until its Retry-After and is not charged
// to the domain, which is issued once the CA takes orders again. Guards against a
// rate limit counted as a failure (ten of them and a healthy domain is 'failed'),
// against the instance that got the answer pausing alone while the others go on
// spending the CA's patience, and against a pause that lasts less than the CA asked.
//
// The CA is Pebble behind a reverse proxy that answers the first new-order POSTs
// with 429 rateLimited and Retry-After: 2. Every URL goes through the proxy: Pebble
// builds the directory's and the orders' URLs from the request's Host, which the
// proxy passes on, and checks the JWS "url" against it.
//
// One domain, so that every new-order after a 429 comes from a claim made after it:
// both instances are woken when the domain is handed back, and either would claim it
// at once if it ignored the pause.
func TestE2E_RateLimitPausesAndIsNotCharged(t *testing.T) {
	t.Parallel()
	const refusals = 2
	const retryAfter = 2 * time.Second
	w := newWorld(t, pebbletest.Options{})
	p := newRateLimitingProxy(t, w.ca, refusals, retryAfter)
	cfg := w.acmeConfig()
	cfg.DirectoryURL = p.url + pebbletest.DirectoryPath
	wcfg := worker.Config{Concurrency: 2, PollInterval: 30 * time.Second}
	a := w.startWorker(t, "a", cfg, wcfg)
	b := w.startWorker(t, "b", cfg, wcfg)

	name := randomName("limited")
	s := startStateSampler(w, 20*time.Millisecond)
	id := w.addDomains(t, name)[0]
	waitFor(t, 30*time.Second, "the domain to be issued", func() bool { return w.domain(t, id).Status == "active" })
	states, err := s.stop()
	require.NoError(t, err)

	require.Equal(t, 0, states[id].maxAttempts, "a rate limit was charged to the domain")
	require.Empty(t, states[id].errors, "a rate limit was recorded as the domain's error")
	seen := p.newOrders()
	require.Len(t, seen, refusals+1, "new-orders at the proxy: %v", seen)
	for i, o := range seen {
		require.Equal(t, i < refusals, o.refused)
		if i > 0 {
			gap := o.at.Sub(seen[i-1].at)
			t.Logf("new-order %d, %s after the 429 before it", i+1, gap.Round(time.Millisecond))
			require.GreaterOrEqual(t, gap, retryAfter, "a new-order reached the CA %s after a 429 with Retry-After %s", gap, retryAfter)
		}
	}
	require.Equal(t, 1, w.ca.OrderRequests(), "only the order after the pauses reaches Pebble")

	// The pause is the CA's Retry-After from the write that recorded the last 429, on
	// the database's clock (the time between the 429 and that write is the host's:
	// held to a second, it could fail on a loaded machine).
	var until, written time.Time
	var reason string
	require.NoError(t, w.pool.QueryRow(w.ctx,
		`SELECT paused_until, updated_at, reason FROM certworker_pauses WHERE scope = 'ca' AND key = $1`, cfg.DirectoryURL).Scan(&until, &written, &reason))
	require.Equal(t, "slow down", reason)
	require.Equal(t, retryAfter, until.Sub(written), "the pause is the CA's Retry-After")
	require.False(t, written.Before(seen[refusals-1].at), "the pause was written at %s, before the 429 it records (%s)", written, seen[refusals-1].at)
	t.Logf("orders started: instance a %d, instance b %d", ordersStarted(a, name), ordersStarted(b, name))
	require.Equal(t, refusals+1, ordersStarted(a, name)+ordersStarted(b, name))
}

// rateLimitingProxy stands in front of Pebble and answers the first new-order POSTs
// with a rate limit.
type rateLimitingProxy struct {
	url        string
	refuse     int
	retryAfter time.Duration
	rp         *httputil.ReverseProxy

	mu   sync.Mutex
	seen []newOrderSeen
}

type newOrderSeen struct {
	at      time.Time
	refused bool
}

func newRateLimitingProxy(t *testing.T, ca *pebbletest.CA, refuse int, retryAfter time.Duration) *rateLimitingProxy {
	t.Helper()
	target, err := url.Parse(ca.DirectoryURL)
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(ca.RootsPEM()))
	p := &rateLimitingProxy{refuse: refuse, retryAfter: retryAfter}
	p.rp = &httputil.ReverseProxy{
		// The request's Host (the proxy's) is passed on: Pebble builds its URLs from
		// it and checks the JWS "url" against it.
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL.Scheme = target.Scheme
			r.Out.URL.Host = target.Host
			r.Out.Host = r.In.Host
		},
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}},
	}
	srv := ca.NewTLSServer(p)
	t.Cleanup(srv.Close)
	p.url = srv.URL
	return p
}

func (p *rateLimitingProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost && r.URL.Path == pebbletest.NewOrderPath {
		p.mu.Lock()
		refused := 0
		for _, s := range p.seen {
			if s.refused {
				refused++
			}
		}
		refuse := refused < p.refuse
		p.seen = append(p.seen, newOrderSeen{at: time.Now(), refused: refuse})
		p.mu.Unlock()
		if refuse {
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Retry-After", strconv.Itoa(int(p.retryAfter/time.Second)))
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, `{"type":"urn:ietf:params:acme:error:rateLimited","detail":"slow down","status":429}`)
			return
		}
	}
	p.rp.ServeHTTP(w, r)
}

func (p *rateLimitingProxy) newOrders() []newOrderSeen {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]newOrderSeen(nil), p.seen...)
}

// stateSampler follows every domain's ssl_status, ssl_attempts and ssl_error at a
// fixed interval.
type stateSampler struct {
	w      *world
	cancel context.CancelFunc
	done   chan struct{}
	states map[string]*domainStates
	err    error
}

type domainStates struct {
	maxAttempts int
	errors      []string
	// provisioningStays counts the samples that found the domain entering
	// 'provisioning'; longestProvisioning is the longest stay seen.
	provisioningStays   int
	longestProvisioning time.Duration
	provisioningSince   time.Time
}

func startStateSampler(w *world, every time.Duration) *stateSampler {
	ctx, cancel := context.WithCancel(w.ctx)
	s := &stateSampler{w: w, cancel: cancel, done: make(chan struct{}), states: map[string]*domainStates{}}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			if err := s.sample(ctx); err != nil && ctx.Err() == nil {
				s.err = err
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// stop ends sampling and returns the states by domain id, or the error that ended
// sampling early.
func (s *stateSampler) stop() (map[string]*domainStates, error) {
	s.cancel()
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		return nil, errors.New("the state sampler did not stop within 30 s")
	}
	if s.err != nil {
		return nil, fmt.Errorf("sample domain states: %w", s.err)
	}
	return s.states, nil
}

func (s *stateSampler) sample(ctx context.Context) error {
	rows, err := s.w.pool.Query(ctx,
		`SELECT id::text, ssl_status, ssl_attempts, ssl_error FROM proxy_domains WHERE tenant_id = $1`, s.w.tenant)
	if err != nil {
		return err
	}
	defer rows.Close()
	now := time.Now()
	for rows.Next() {
		var id, status string
		var attempts int
		var sslErr *string
		if err := rows.Scan(&id, &status, &attempts, &sslErr); err != nil {
			return err
		}
		st := s.states[id]
		if st == nil {
			st = &domainStates{}
			s.states[id] = st
		}
		st.maxAttempts = max(st.maxAttempts, attempts)
		if sslErr != nil && (len(st.errors) == 0 || st.errors[len(st.errors)-1] != *sslErr) {
			st.errors = append(st.errors, *sslErr)
		}
		switch {
		case status == "provisioning" && st.provisioningSince.IsZero():
			st.provisioningSince = now
			st.provisioningStays++
		case status != "provisioning" && !st.provisioningSince.IsZero():
			st.longestProvisioning = max(st.longestProvisioning, now.Sub(st.provisioningSince))
			st.provisioningSince = time.Time{}
		}
	}
	return rows.Err()
}
