// Package fakeissuer is a queue.Issuer for tests about the queue and the worker, not
// about ACME: it returns a self-signed certificate after an optional delay, fails or
// panics on request, and records every call.
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

	"github.com/certworker/certworker/queue"
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
	return &Issuer{calls: map[string]int{}, cancelled: map[string]int{}, events: make(chan Call, buffer), key: key}
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

// Issue implements queue.Issuer.
func (f *Issuer) Issue(ctx context.Context, req queue.Request) (*queue.Certificate, error) {
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
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-ctx.Done():
			f.mu.Lock()
			f.cancelled[req.Domain]++
			f.mu.Unlock()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
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

func (f *Issuer) certificate(domain string, lifetime time.Duration) (*queue.Certificate, error) {
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
	return &queue.Certificate{
		ChainPEM:   string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		PrivateKey: string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})),
		NotBefore:  now,
		NotAfter:   now.Add(lifetime),
		Issuer:     "fake issuer",
		Serial:     serial.Text(16),
		RenewAt:    queue.RenewAtFromValidity(now, now.Add(lifetime)),
	}, nil
}
