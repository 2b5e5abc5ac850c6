package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/internal/workertest"
)

// binary is the fakeworker program, built once by TestMain; sources are the
// directories of the packages it is built from.
var (
	binary  string
	sources []string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fakeworker-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakeworker test:", err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "fakeworker")
	build := exec.Command("go", "build", "-trimpath", "-o", binary, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "fakeworker test: build:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.Dir}}{{end}}", ".").Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakeworker test: go list:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	sources = strings.Fields(string(out))
	pgtest.Main(m, func() { os.RemoveAll(dir) })
}

var recordSources sync.Once

// recordSourcesAsInputs makes go test's cache aware of the worker's code. The test
// binary does not contain it (the program TestMain builds does), so a change to it
// would otherwise leave the test binary as it was and go test would report the
// result of a run before the change. go test keys a cached result on the files and
// directories a test opened, within the module: opening the source directories here
// (during the tests; TestMain is not recorded) ties the result to them.
func recordSourcesAsInputs(t *testing.T) {
	t.Helper()
	recordSources.Do(func() {
		for _, d := range sources {
			_, err := os.ReadDir(d)
			require.NoError(t, err)
		}
	})
}

// entry is one JSON log line.
type entry map[string]any

func (e entry) msg() string { return fmt.Sprint(e["msg"]) }

// is reports whether the line has the message and every given field (numbers are
// compared as JSON decodes them, float64).
func (e entry) is(msg string, fields entry) bool {
	if e.msg() != msg {
		return false
	}
	for k, v := range fields {
		if fmt.Sprint(e[k]) != fmt.Sprint(v) {
			return false
		}
	}
	return true
}

// entries parses the JSON lines written so far; anything else (a panic, a race
// report) is skipped here and shown by the failure dump.
func entries(b *workertest.Buffer) []entry {
	var out []entry
	for line := range strings.Lines(b.String()) {
		var e entry
		if json.Unmarshal([]byte(line), &e) == nil {
			out = append(out, e)
		}
	}
	return out
}

// proc is one fakeworker process.
type proc struct {
	owner string
	cmd   *exec.Cmd
	logs  *workertest.Buffer
	// exited is closed when the process has ended, with Wait's error in waitErr.
	exited  chan struct{}
	waitErr error
}

// startProc starts a fakeworker on dsn named owner and waits until its start-up pass
// has finished, so that it is listening. It is killed, if still running, when the
// test ends, and its logs are printed if the test failed.
func startProc(t *testing.T, dsn, owner string, args ...string) *proc {
	t.Helper()
	recordSourcesAsInputs(t)
	p := &proc{owner: owner, logs: &workertest.Buffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(binary, append([]string{"--database-url", dsn, "--owner", owner}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	require.NoError(t, p.cmd.Start())
	go func() { p.waitErr = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		if p.running() && t.Failed() {
			// A failed test shows where each of the process's goroutines was: Go's
			// runtime prints their stacks to stderr (the logs below) at SIGQUIT.
			_ = p.cmd.Process.Signal(syscall.SIGQUIT)
			select {
			case <-p.exited:
			case <-time.After(5 * time.Second):
			}
		}
		if p.running() {
			_ = p.cmd.Process.Kill()
		}
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			t.Errorf("%s: did not exit after SIGKILL", owner)
		}
		if t.Failed() {
			t.Logf("%s (%v) logs:\n%s", owner, p.cmd.Args[1:], p.logs.String())
		}
	})
	p.waitLog(t, 30*time.Second, "its start-up pass", func(e entry) bool { return e.msg() == "pass finished" })
	return p
}

func (p *proc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// find is the first log line that matches, or nil.
func (p *proc) find(match func(entry) bool) entry {
	logs := entries(p.logs)
	if i := index(logs, 0, match); i >= 0 {
		return logs[i]
	}
	return nil
}

// waitLog waits for a log line that matches, and returns it. The process ending
// first fails the test at once.
func (p *proc) waitLog(t *testing.T, timeout time.Duration, what string, match func(entry) bool) entry {
	t.Helper()
	var found entry
	p.waitLogs(t, timeout, what, func(logs []entry) bool {
		if i := index(logs, 0, match); i >= 0 {
			found = logs[i]
			return true
		}
		return false
	})
	return found
}

// waitLogs waits until cond holds for the log lines written so far.
func (p *proc) waitLogs(t *testing.T, timeout time.Duration, what string, cond func([]entry) bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if cond(entries(p.logs)) {
			return
		}
		if !p.running() {
			t.Fatalf("%s exited (%v) while waiting for %s", p.owner, p.waitErr, what)
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s in the logs of %s", timeout, what, p.owner)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// index is the position of the first line from from on that matches, or -1.
func index(logs []entry, from int, match func(entry) bool) int {
	for i := max(from, 0); i < len(logs); i++ {
		if match(logs[i]) {
			return i
		}
	}
	return -1
}

// signal sends sig and waits for the process to exit, returning how long it took.
func (p *proc) signal(t *testing.T, sig syscall.Signal, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	require.NoError(t, p.cmd.Process.Signal(sig))
	select {
	case <-p.exited:
		return time.Since(start)
	case <-time.After(timeout):
		t.Fatalf("%s did not exit within %s of %s", p.owner, timeout, sig)
		return 0
	}
}

// bed is one test's database.
type bed struct {
	ctx  context.Context
	pool *pgxpool.Pool
	dsn  string
}

func setup(t *testing.T) *bed {
	t.Helper()
	pool, dsn := pgtest.NewPool(t)
	return &bed{ctx: context.Background(), pool: pool, dsn: dsn}
}

// setupOn is setup on a server of the test's own (pgtest.StartServer).
func setupOn(t *testing.T, s *pgtest.Server) *bed {
	t.Helper()
	dsn := s.NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &bed{ctx: context.Background(), pool: pool, dsn: dsn}
}

// inserted is a domain as the test inserted it, before any worker could touch it.
type inserted struct {
	id, name    string
	attempts    int
	lastAttempt *time.Time
}

// domain inserts a verified ACME domain, pending, with attempts and a last attempt
// lastAgo before the database's now (nil: never tried). The insert notifies, as a
// tenant's would.
func (b *bed) domain(t *testing.T, attempts int, lastAgo *time.Duration) inserted {
	t.Helper()
	var tenant string
	require.NoError(t, b.pool.QueryRow(b.ctx,
		`INSERT INTO proxy_tenants (name, slug, email) VALUES ('process test', $1, 'p@certworker.invalid') RETURNING id::text`,
		"t-"+uuid.NewString()).Scan(&tenant))
	name := fmt.Sprintf("p-%s.example", uuid.NewString())
	var secs *float64
	if lastAgo != nil {
		s := lastAgo.Seconds()
		secs = &s
	}
	d := inserted{name: name, attempts: attempts}
	require.NoError(t, b.pool.QueryRow(b.ctx, `
INSERT INTO proxy_domains
    (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider,
     ssl_attempts, ssl_last_attempt_at)
VALUES ($1, $2, 'verified', 'tok', 'pending', 'acme', $3,
    CASE WHEN $4::float8 IS NULL THEN NULL ELSE now() - make_interval(secs => $4::float8) END)
RETURNING id::text, ssl_last_attempt_at`, tenant, name, attempts, secs).Scan(&d.id, &d.lastAttempt))
	return d
}

// row is the part of a domain's row these tests read.
type row struct {
	Status      string
	Attempts    int
	LastAttempt *time.Time
	ClaimedBy   *string
	UpdatedAt   time.Time
	Error       *string
}

func (b *bed) row(t *testing.T, id string) row {
	t.Helper()
	var r row
	require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT ssl_status, ssl_attempts, ssl_last_attempt_at, ssl_claimed_by, updated_at, ssl_error
FROM proxy_domains WHERE id = $1`, id).Scan(&r.Status, &r.Attempts, &r.LastAttempt, &r.ClaimedBy, &r.UpdatedAt, &r.Error))
	return r
}

// waitRow polls the domain's row every 50ms until cond holds, and returns it.
func (b *bed) waitRow(t *testing.T, timeout time.Duration, id, what string, cond func(row) bool) row {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		r := b.row(t, id)
		if cond(r) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s; row: %+v", timeout, what, r)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ownedBy reports whether ssl_claimed_by names the instance started as owner (the
// worker adds a random suffix to the name it is given, so that no two instances
// share one).
func ownedBy(claimedBy, owner string) bool { return strings.HasPrefix(claimedBy, owner+"/") }

func claimedBy(owner string) func(row) bool {
	return func(r row) bool {
		return r.Status == "provisioning" && r.ClaimedBy != nil && ownedBy(*r.ClaimedBy, owner)
	}
}

func ptr[T any](v T) *T { return &v }

// The instance running an order is SIGKILLed (OOM killer, node lost): nothing of it
// runs any more, not a deferred hand-back, not a heartbeat. Another instance must
// issue the domain, with the lost attempt counted, within two leases of the claim:
// 2 minutes with the production lease of 60 s (docs/high-availability.md, "Leases
// and fencing"). The test scales the lease down to 4 s, and leaves B's poll at 30 s,
// far longer than two leases. Guards against a claim that nothing takes back in time
// (the reference waited 15 minutes), and against a lease that only runs out in
// theory: B has to set its timer for the lease's end, not come across it on a later
// poll or never.
func TestProcess_KilledMidOrderIsIssuedByAnotherWithinTwoLeases(t *testing.T) {
	t.Parallel()
	const lease = 4 * time.Second
	b := setup(t)
	a := startProc(t, b.dsn, "A-"+uuid.NewString()[:8], "--delay", "1h", "--lease", lease.String())
	d := b.domain(t, 0, nil)
	id, name := d.id, d.name
	claim := b.waitRow(t, 10*time.Second, id, "A to claim the domain", claimedBy(a.owner))
	claimAt := *claim.LastAttempt

	a.signal(t, syscall.SIGKILL, 10*time.Second)
	r := b.row(t, id)
	require.Equal(t, "provisioning", r.Status, "the killed instance's claim is gone already")
	require.True(t, ownedBy(*r.ClaimedBy, a.owner), "claimed by %s", *r.ClaimedBy)

	bproc := startProc(t, b.dsn, "B-"+uuid.NewString()[:8], "--delay", "0", "--lease", lease.String(), "--poll-interval", "30s")
	// The two leases run from when B is up as well: an instance takes back no claim
	// before it has reached the database for a whole lease (docs/high-availability.md,
	// "Leases and fencing"), and B's start, after A's death, is the test's, which a
	// busy machine stretches by seconds. In a fleet the other instance is running.
	var up time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT now()`).Scan(&up))
	from := claimAt
	if up.After(from) {
		from = up
	}
	active := b.waitRow(t, 2*lease+15*time.Second, id, "B to issue the domain", func(r row) bool { return r.Status == "active" })
	reclaimedAt := *active.LastAttempt // B's claim; MarkActive keeps it
	issuedAfter := active.UpdatedAt.Sub(from)
	t.Logf("A claimed at %s; B up %s after it; B claimed again %s after A's claim and issued %s after the later of the two",
		claimAt.Format(time.RFC3339Nano), up.Sub(claimAt), reclaimedAt.Sub(claimAt), issuedAfter)
	require.Less(t, issuedAfter, 2*lease, "issued too late after the abandoned claim")
	require.GreaterOrEqual(t, reclaimedAt.Sub(claimAt), lease, "A's claim was taken before its lease ran out")
	require.Zero(t, active.Attempts, "an active domain keeps an attempt count")

	// The abandoned attempt was counted: B requeued it as attempt 1, and ordered it
	// as attempt 2.
	fields := entry{"domain": name, "domain_id": id}
	requeued := bproc.find(func(e entry) bool {
		return e.is("domain was left mid-issuance by an instance that stopped; requeued", fields)
	})
	require.NotNil(t, requeued, "B did not log the requeue")
	require.EqualValues(t, 1, requeued["attempt"], "the abandoned attempt was not counted")
	started := bproc.find(func(e entry) bool { return e.is("order started", fields) })
	require.NotNil(t, started)
	require.EqualValues(t, 2, started["attempt"])
	// The row is active once the store commits; the log line follows it.
	bproc.waitLog(t, 5*time.Second, "B's log of the certificate", func(e entry) bool { return e.is("certificate issued", fields) })
}

// A live order that takes longer than the lease (a slow CA, a DNS check that waits
// for propagation) stays with the instance running it: its heartbeat renews the
// lease every third of it, across processes, and another instance watching the same
// queue never reclaims or orders it. Guards against a lease that is set at the claim
// and never renewed, which would have every slow order ordered twice, spending the
// CA's rate limit and racing two certificates into one row.
func TestProcess_ASlowLiveOrderIsNotTakenByAnother(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := startProc(t, b.dsn, "A-"+uuid.NewString()[:8], "--lease", "3s", "--delay", "12s")
	d := b.domain(t, 0, nil)
	id, name := d.id, d.name
	b.waitRow(t, 10*time.Second, id, "A to claim the domain", claimedBy(a.owner))
	other := startProc(t, b.dsn, "B-"+uuid.NewString()[:8], "--lease", "3s", "--delay", "0", "--poll-interval", "500ms")

	// A's order ends 12 s after the claim, four leases later.
	b.waitRow(t, 30*time.Second, id, "A to issue the domain", func(r row) bool { return r.Status == "active" })
	fields := entry{"domain": name}
	// The row is active once the store commits; A's log line follows it, through a pipe.
	a.waitLog(t, 5*time.Second, "A's log of the certificate", func(e entry) bool { return e.is("certificate issued", fields) })
	require.Nil(t, a.find(func(e entry) bool { return e.is("result dropped: the claim was lost to another instance", fields) }))
	require.Nil(t, other.find(func(e entry) bool { return e.is("order started", fields) }), "B ordered a domain A was still working on")
	require.Nil(t, other.find(func(e entry) bool {
		return e.is("domain was left mid-issuance by an instance that stopped; requeued", fields)
	}), "B took A's live claim")
	// B was awake all along: it had passes in the meantime.
	passes := 0
	for _, e := range entries(other.logs) {
		if e.msg() == "pass finished" {
			passes++
		}
	}
	require.Greater(t, passes, 5, "B did not look at the queue while A's order ran")
}

// SIGTERM while orders are in flight (a rolling deploy): the process stops claiming,
// gives the orders --shutdown-grace, hands back what is still running (pending,
// attempts and last attempt as they were, so not charged and claimable at once),
// and exits 0 soon after the grace. Guards against a shutdown that hangs on an order
// until the orchestrator's SIGKILL, which would leave the domains in 'provisioning'
// until their lease runs out, or that charges an attempt for the instance's own stop.
func TestProcess_SIGTERMMidOrderExitsCleanlyWithinTheGrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const grace = 2 * time.Second
	a := startProc(t, b.dsn, "A-"+uuid.NewString()[:8], "--delay", "1h", "--shutdown-grace", grace.String(), "--concurrency", "2")
	domains := []inserted{b.domain(t, 0, nil), b.domain(t, 3, ptr(24*time.Hour))}
	for _, d := range domains {
		b.waitRow(t, 10*time.Second, d.id, "A to claim "+d.name, claimedBy(a.owner))
	}

	took := a.signal(t, syscall.SIGTERM, grace+5*time.Second)
	t.Logf("exited %s after SIGTERM (grace %s)", took, grace)
	require.NoError(t, a.waitErr, "exit status after SIGTERM")
	require.GreaterOrEqual(t, took, grace, "in-flight orders were not given the grace")

	for _, d := range domains {
		r := b.row(t, d.id)
		require.Equal(t, "pending", r.Status, "%s left in %s", d.name, r.Status)
		require.Equal(t, d.attempts, r.Attempts, "the hand-back was charged")
		if d.lastAttempt == nil {
			require.Nil(t, r.LastAttempt, "the hand-back started a backoff")
		} else {
			require.NotNil(t, r.LastAttempt)
			require.True(t, d.lastAttempt.Equal(*r.LastAttempt), "the hand-back moved the backoff: %s, was %s", r.LastAttempt, d.lastAttempt)
		}
		require.Nil(t, r.ClaimedBy)
	}
	var provisioning int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM proxy_domains WHERE ssl_status = 'provisioning'`).Scan(&provisioning))
	require.Zero(t, provisioning)
	require.NotNil(t, a.find(func(e entry) bool { return e.msg() == "worker stopped" }))
}

// The database restarts (a minor-version upgrade, a failover) while a retry's
// backoff runs out: the worker's timer fires into the outage and its pass fails.
// The process must ride it out, not exit, and catch up as soon as the database is
// back: the listener's reconnection (or the timer's retry of its failed pass) wakes it, and the domain is issued within
// seconds, not at the next --poll-interval (an hour here, so that only the
// reconnection can explain it). Guards against a worker that exits on a database
// error (it would silently stop issuing for the life of the process, the failure
// this service exists to remove), and against a timer that fired into the outage
// and that nothing replaces.
func TestProcess_SurvivesADatabaseRestart(t *testing.T) {
	t.Parallel()
	srv := pgtest.StartServer(t)
	b := setupOn(t, srv)
	// The backoff after one attempt, twice the base, must outlast the stop (a second or
	// two, more on a loaded machine) and run out in the outage.
	const retryBase = 5 * time.Second
	w := startProc(t, b.dsn, "W-"+uuid.NewString()[:8], "--poll-interval", "1h", "--retry-base", retryBase.String(),
		"--reconnect-max", "1s")
	d := b.domain(t, 1, ptr(time.Duration(0)))
	id, name := d.id, d.name
	dueAt := d.lastAttempt.Add(2 * retryBase)
	// The insert's notification: the worker has seen the domain, inside its backoff.
	w.waitLog(t, 10*time.Second, "the pass of the insert", func(e entry) bool { return e.is("wake-up", entry{"source": "notify"}) })

	require.Equal(t, "pending", b.row(t, id).Status)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stopAt := time.Now()
	require.NoError(t, srv.Stop(ctx))
	down := time.Now()
	t.Logf("database stopped in %s; the backoff runs out %s later", down.Sub(stopAt), dueAt.Sub(down))
	// Inside its backoff until dueAt, so nothing can have claimed it before the outage.
	require.True(t, down.Before(dueAt.Add(-500*time.Millisecond)),
		"the database took %s to stop: the backoff ran out before the outage", down.Sub(stopAt))

	// The timer fires into the outage, and that pass fails.
	w.waitLogs(t, 15*time.Second, "the timer's pass to fail", func(logs []entry) bool {
		timer := index(logs, 0, func(e entry) bool { return e.is("wake-up", entry{"source": "timer"}) })
		return timer >= 0 && index(logs, timer, func(e entry) bool {
			return e.msg() == "database step failed; will try again"
		}) >= 0
	})
	for time.Since(down) < 6*time.Second {
		require.True(t, w.running(), "the worker exited while the database was down: %v", w.waitErr)
		time.Sleep(100 * time.Millisecond)
	}

	restartAt := time.Now()
	require.NoError(t, srv.Start(ctx))
	up := time.Now()
	t.Logf("database down for %s, started again in %s", up.Sub(down), up.Sub(restartAt))
	deadline := up.Add(15 * time.Second)
	for b.row(t, id).Status != "active" {
		require.True(t, w.running(), "the worker exited after the restart: %v", w.waitErr)
		require.True(t, time.Now().Before(deadline), "not issued within 15 s of the database's return; row: %+v", b.row(t, id))
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("issued %s after the database answered again", time.Since(up))
	require.True(t, w.running(), "the worker exited: %v", w.waitErr)

	// What woke it was the listener's reconnection, after the restart.
	// The listener reconnects too (perhaps after the timer's pass has caught up).
	w.waitLog(t, 15*time.Second, "the listener's reconnection", func(e entry) bool { return e.msg() == "listener reconnected" })
	logs := entries(w.logs)
	at := func(from int, match func(entry) bool) int { return index(logs, from, match) }
	lost := at(0, func(e entry) bool { return e.msg() == "listener connection lost" })
	require.GreaterOrEqual(t, lost, 0, "the listener never saw the outage")
	back := at(lost, func(e entry) bool { return e.msg() == "listener reconnected" })
	require.Greater(t, back, lost, "no reconnection logged")
	// Whichever comes first after the restart catches up: the listener's
	// reconnection, or the timer, which retries a failed pass at short, growing
	// intervals instead of waiting for the poll.
	started := at(lost, func(e entry) bool { return e.is("order started", entry{"domain": name}) })
	require.Greater(t, started, lost, "the order did not start after the outage")
	require.Contains(t, []any{"reconnect", "timer"}, logs[started]["source"])
	require.EqualValues(t, 2, logs[started]["attempt"])
}

// An order still running when the database goes away for longer than the lease
// (issue #17, which reversed issue #9's rule): the instance cannot renew the lease,
// and cannot tell an outage every instance shares from a partition of its own, in
// which another instance may reclaim the row once the lease has run out. So it stops
// the order at its deadline, before the lease runs out, and once the database is back
// hands the claim back uncharged (nobody else runs here, so nobody reclaimed it) and
// orders the domain afresh. Guards against the heartbeat renewing the expired lease
// and the order running on, and against the instance requeuing its own claim as
// abandoned, which would charge it an attempt.
func TestProcess_AnOrderOutlivedByItsLeaseStopsAndIsHandedBackUncharged(t *testing.T) {
	t.Parallel()
	srv := pgtest.StartServer(t)
	b := setupOn(t, srv)
	const lease = 4 * time.Second
	w := startProc(t, b.dsn, "W-"+uuid.NewString()[:8], "--lease", lease.String(), "--delay", "6s",
		"--poll-interval", "1h", "--reconnect-max", "1s")
	d := b.domain(t, 0, nil)
	id, name := d.id, d.name
	b.waitRow(t, 10*time.Second, id, "the worker to claim the domain", claimedBy(w.owner))

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, srv.Stop(ctx))
	down := time.Now()
	for time.Since(down) < lease+2*time.Second {
		require.True(t, w.running(), "the worker exited while the database was down: %v", w.waitErr)
		time.Sleep(100 * time.Millisecond)
	}
	require.NoError(t, srv.Start(ctx))
	t.Logf("database down for %s", time.Since(down))

	r := b.waitRow(t, 40*time.Second, id, "the domain to be issued", func(r row) bool { return r.Status == "active" })
	fields := entry{"domain": name}
	var started int
	for _, e := range entries(w.logs) {
		if e.is("order started", fields) {
			started++
		}
	}
	require.Equal(t, 2, started, "the order outlived by its lease ran on, or the domain was ordered more than twice")
	require.Zero(t, r.Attempts, "the stopped order was charged")
	require.NotNil(t, w.find(func(e entry) bool {
		return e.is("order stopped at its lease deadline: the lease could not be renewed in time; nothing more is sent to the CA, and the claim is handed back uncharged once the database answers", fields)
	}))
	require.Nil(t, w.find(func(e entry) bool {
		return e.is("domain was left mid-issuance by an instance that stopped; requeued", fields)
	}), "the instance requeued its own claim as abandoned")
}
