// Package fakeissuer is a issuing.Issuer for tests about the queue and the worker, not
// about ACME: it returns a self-signed certificate after an optional delay, fails or
// panics on request, and records every call.
//
// It honours the lease deadline as issuing.Issuer asks, as a CA order of two requests:
// the call itself is the new order (not made once req.Deadline has passed), the
// delay is the wait on the CA (cut off at the deadline), and the certificate is the
// finalize (not made once the deadline has passed; Finalized counts those made).
package fakeissuer

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"sync"
	"testing"
	"time"

	"github.com/certworker/certworker/queue/issuing"
)

// Issuer is the fake. Set its fields before use; they are read under mu.
type Issuer struct {
	mu sync.Mutex
	// Delay before answering; the call returns early with ctx's error if ctx ends.
	Delay time.Duration
	// Fail, if set, decides per call (n counts this domain's calls from 1) whether to
	// fail and with what.
	Fail func(domain string, n int) error
	// Lifetime of the certificates it returns (default 90 days).
	Lifetime time.Duration

	calls     map[string]int
	cancelled map[string]int
	finalized map[string]int
	events    chan Call
	key       *ecdsa.PrivateKey
}

// Call is one Issue call.
type Call struct {
	Domain string
	At     time.Time
	N      int
}

// New returns a fake whose Calls channel holds up to buffer events (older ones are
// dropped when nobody reads).
func New(buffer int) *Issuer {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	return &Issuer{calls: map[string]int{}, cancelled: map[string]int{}, finalized: map[string]int{},
		events: make(chan Call, buffer), key: key}
}

// Calls delivers every call as it starts.
func (f *Issuer) Calls() <-chan Call { return f.events }

// Count is how many times domain was ordered.
func (f *Issuer) Count(domain string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[domain]
}

// Cancelled is how many of domain's calls ended because their context did.
func (f *Issuer) Cancelled(domain string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cancelled[domain]
}

// Next waits up to timeout for the next call to start, and fails the test if none
// does: a regression then fails in seconds instead of hanging until the test binary's
// limit.
func (f *Issuer) Next(t testing.TB, timeout time.Duration) Call {
	t.Helper()
	select {
	case c := <-f.events:
		return c
	case <-time.After(timeout):
		t.Fatalf("fake issuer: no call within %s", timeout)
		return Call{}
	}
}

// Finalized is how many of domain's calls got as far as the certificate (the
// finalize of a real order), whether they then returned it or a requested failure.
func (f *Issuer) Finalized(domain string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.finalized[domain]
}

// Counts is a copy of every domain's call count.
func (f *Issuer) Counts() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]int, len(f.calls))
	for k, v := range f.calls {
		out[k] = v
	}
	return out
}

// Set changes the fake's behaviour under its lock.
func (f *Issuer) Set(fn func(f *Issuer)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// ErrPanic asks the fake to panic instead of returning.
var ErrPanic = errors.New("fakeissuer: panic requested")

// Issue implements issuing.Issuer.
func (f *Issuer) Issue(ctx context.Context, req issuing.Request) (*issuing.Certificate, error) {
	if err := req.Deadline.Check(); err != nil {
		return nil, fmt.Errorf("fakeissuer: order not placed: %w", err)
	}
	f.mu.Lock()
	f.calls[req.Domain]++
	n := f.calls[req.Domain]
	delay, fail, lifetime := f.Delay, f.Fail, f.Lifetime
	f.mu.Unlock()
	select {
	case f.events <- Call{Domain: req.Domain, At: time.Now(), N: n}:
	default:
	}
	if delay > 0 {
		if err := f.wait(ctx, req, delay); err != nil {
			return nil, err
		}
	}
	if err := req.Deadline.Check(); err != nil {
		f.count(f.cancelled, req.Domain)
		return nil, fmt.Errorf("fakeissuer: not finalized: %w", err)
	}
	f.count(f.finalized, req.Domain)
	if fail != nil {
		if err := fail(req.Domain, n); err != nil {
			if errors.Is(err, ErrPanic) {
				panic(fmt.Sprintf("fake issuer panics for %s", req.Domain))
			}
			return nil, err
		}
	}
	if lifetime <= 0 {
		lifetime = 90 * 24 * time.Hour
	}
	return f.certificate(req.Domain, lifetime)
}

// wait is the order's wait on the CA: delay, cut off by ctx or by the lease deadline
// as renewals move it (each counted as cancelled).
func (f *Issuer) wait(ctx context.Context, req issuing.Request, delay time.Duration) error {
	bounded, cancel := req.Deadline.Bound(ctx)
	defer cancel()
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-bounded.Done():
		f.count(f.cancelled, req.Domain)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("fakeissuer: %w", context.Cause(bounded))
	case <-t.C:
		return nil
	}
}

func (f *Issuer) count(m map[string]int, domain string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m[domain]++
}

func (f *Issuer) certificate(domain string, lifetime time.Duration) (*issuing.Certificate, error) {
	now := time.Now().Truncate(time.Second)
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: domain},
		Issuer:       pkix.Name{CommonName: "fake issuer"},
		DNSNames:     []string{domain},
		NotBefore:    now,
		NotAfter:     now.Add(lifetime),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &f.key.PublicKey, f.key)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(f.key)
	if err != nil {
		return nil, err
	}
	return &issuing.Certificate{
		ChainPEM:   string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		PrivateKey: string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})),
		NotBefore:  now,
		NotAfter:   now.Add(lifetime),
		Issuer:     "fake issuer",
		Serial:     serial.Text(16),
		RenewAt:    issuing.RenewAtFromValidity(now, now.Add(lifetime)),
	}, nil
}
