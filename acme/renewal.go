package acme

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"

	legoacme "github.com/go-acme/lego/v4/acme"
	"github.com/go-acme/lego/v4/certificate"

	"github.com/certworker/certworker/queue"
)

const (
	// renewalInfoDefault is when renewal information is asked again when the CA
	// sent no Retry-After. Let's Encrypt and Pebble both send six hours; RFC 9773
	// §4.3 leaves the choice to the client when none comes.
	renewalInfoDefault = 6 * time.Hour
	// renewalInfoMin and renewalInfoMax bound the CA's Retry-After, as RFC 9773
	// §4.3 advises: no more often than a minute, no less often than a day.
	renewalInfoMin = time.Minute
	renewalInfoMax = 24 * time.Hour
	// renewalInfoAfterError is when renewal information is asked again after the
	// question failed (the CA down, a malformed answer): soon enough to catch a
	// revocation the same day, rarely enough not to add to a CA's trouble.
	renewalInfoAfterError = time.Hour
)

// RenewAtFromValidity is the renewal time of a certificate whose CA offers no ACME
// Renewal Information: when a third of its lifetime remains (a 90-day certificate
// renews after 60 days, a 6-day one after 4). It is queue.RenewAtFromValidity: the
// queue applies the same rule to certificates uploaded by hand, and the two have to
// agree. (The queue cannot import this package, which imports it.)
func RenewAtFromValidity(notBefore, notAfter time.Time) time.Time {
	return queue.RenewAtFromValidity(notBefore, notAfter)
}

// RenewAtFromWindow picks the renewal time of a certificate valid from notBefore to
// notAfter inside a CA's suggested renewal window [start, end): a uniformly random
// point (RFC 9773 §4.2, so that certificates issued at the same moment are not all
// renewed at the same moment), never in the certificate's last tenth.
//
// The last tenth of the lifetime is kept back because the CA's window may run to
// the very end of the certificate (Pebble's does for short-lived ones), and a
// renewal drawn seconds before expiry leaves no room for a slow or failed order. A
// window that starts inside it (Let's Encrypt's window for a certificate it means to
// revoke may be 5 to 3 days before the expiry of a 90-day certificate) renews at its
// start; a window already open renews now.
//
// It reports false for a window it does not trust: empty or reversed, already over
// (for a certificate just issued, renewing at once would get a new certificate with
// the same window, and renew that at once too, until the CA's rate limit stops it),
// or starting at or after the expiry.
func RenewAtFromWindow(start, end, notBefore, notAfter, now time.Time) (time.Time, bool) {
	if start.IsZero() || end.IsZero() || !end.After(start) || !end.After(now) || !start.Before(notAfter) {
		return time.Time{}, false
	}
	latest := notAfter.Add(-notAfter.Sub(notBefore) / 10)
	from := start
	if now.After(from) {
		from = now
	}
	to := end
	if latest.Before(to) {
		to = latest
	}
	if !to.After(from) {
		return from, true
	}
	return from.Add(time.Duration(rand.Int64N(int64(to.Sub(from))))), true
}

// renewAt is the renewal time of a certificate just issued: from the ARI window when
// the CA gave a usable one, else the third-of-lifetime rule. fromWindow says which.
func renewAt(leaf *x509.Certificate, w *queue.RenewalWindow, now time.Time) (at time.Time, fromWindow bool) {
	if w != nil {
		if t, ok := RenewAtFromWindow(w.Start, w.End, leaf.NotBefore, leaf.NotAfter, now); ok {
			return t, true
		}
	}
	return RenewAtFromValidity(leaf.NotBefore, leaf.NotAfter), false
}

// renewalInfoAt is when renewal information is to be asked again, from the CA's
// Retry-After (0 when it gave none).
func renewalInfoAt(retryAfter time.Duration, now time.Time) time.Time {
	if retryAfter <= 0 {
		retryAfter = renewalInfoDefault
	}
	return now.Add(min(max(retryAfter, renewalInfoMin), renewalInfoMax))
}

var _ queue.RenewalInformer = (*Issuer)(nil)

// RenewalInfo asks the CA for its suggested renewal window of the certificate
// chainPEM starts with (ACME Renewal Information, RFC 9773): the worker asks again,
// at the CA's Retry-After, for every stored certificate while it is valid, so that
// a window the CA moves earlier (a revocation coming) is acted on. It sends one GET
// (the directory comes from the Issuer's session) and needs no account.
//
// It returns queue.ErrNoRenewalInfo when the CA offers none, or the certificate
// cannot be named to it (no authority key identifier); a *queue.CAUnavailableError
// when the CA cannot be reached or answers 5xx; another error when the CA refuses
// the question (it does not know the certificate) or its answer is not a window.
func (i *Issuer) RenewalInfo(ctx context.Context, chainPEM string) (*queue.RenewalWindow, error) {
	chain, err := parseChain([]byte(chainPEM))
	if err != nil {
		return nil, fmt.Errorf("renewal information: %w", err)
	}
	tr := i.orderTransport(ctx)
	hc := &http.Client{Transport: tr, Timeout: i.cfg.httpTimeout()}
	w, err := i.renewalInfo(hc, chain[0])
	if err != nil && !errors.Is(err, queue.ErrNoRenewalInfo) {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("renewal information: %w", context.Cause(ctx))
		}
		if cause := tr.unreachable(); cause != nil {
			return nil, &queue.CAUnavailableError{Err: &failure{msg: truncate("acme: " + cause.Error()), err: cause}}
		}
	}
	return w, err
}

// renewalInfo fetches leaf's renewal information through hc.
func (i *Issuer) renewalInfo(hc *http.Client, leaf *x509.Certificate) (*queue.RenewalWindow, error) {
	if len(leaf.AuthorityKeyId) == 0 {
		return nil, fmt.Errorf("renewal information: the certificate has no authority key identifier to name it by: %w", queue.ErrNoRenewalInfo)
	}
	id, err := certificate.MakeARICertID(leaf)
	if err != nil {
		return nil, fmt.Errorf("renewal information: %w", err)
	}
	dir, err := i.directory(hc)
	if err != nil {
		return nil, err
	}
	if dir.RenewalInfo == "" {
		return nil, queue.ErrNoRenewalInfo
	}
	resp, err := hc.Get(strings.TrimSuffix(dir.RenewalInfo, "/") + "/" + id)
	if err != nil {
		return nil, fmt.Errorf("acme: renewal information: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("acme: renewal information: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("acme: renewal information: the CA answered %s: %s", resp.Status, truncate(string(body)))
	}
	var info legoacme.RenewalInfoResponse
	if err := json.Unmarshal(body, &info); err != nil {
		return nil, fmt.Errorf("acme: renewal information: %w", err)
	}
	w := info.SuggestedWindow
	// RFC 9773 §4.2: a window whose end is not after its start is to be treated as
	// no answer at all.
	if w.Start.IsZero() || !w.End.After(w.Start) {
		return nil, fmt.Errorf("acme: renewal information: the CA's window [%s, %s) is empty", w.Start, w.End)
	}
	return &queue.RenewalWindow{Start: w.Start, End: w.End, RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"))}, nil
}

// directory is the CA's directory (hc's transport answers from the session while
// it is fresh).
func (i *Issuer) directory(hc *http.Client) (legoacme.Directory, error) {
	resp, err := hc.Get(i.cfg.DirectoryURL)
	if err != nil {
		return legoacme.Directory{}, fmt.Errorf("acme: get directory: %w", err)
	}
	defer resp.Body.Close()
	var dir legoacme.Directory
	if resp.StatusCode != http.StatusOK {
		return dir, fmt.Errorf("acme: get directory: the CA answered %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&dir); err != nil {
		return dir, fmt.Errorf("acme: get directory: %w", err)
	}
	return dir, nil
}
