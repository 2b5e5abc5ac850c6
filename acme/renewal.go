package acme

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	legoacme "github.com/go-acme/lego/v4/acme"
	"github.com/go-acme/lego/v4/certificate"
	"go.uber.org/zap"

	"github.com/certworker/certworker/queue/issuing"
)

// RenewAtFromValidity is the renewal time of a certificate whose CA offers no ACME
// Renewal Information: when a third of its lifetime remains for 10 days or more (a
// 90-day certificate renews after 60 days), half below (a 6-day one after 3). It is
// issuing.RenewAtFromValidity: the queue applies the same rule to certificates
// uploaded by hand, and the two have to agree. (The queue cannot import this
// package, which imports it.)
func RenewAtFromValidity(notBefore, notAfter time.Time) time.Time {
	return issuing.RenewAtFromValidity(notBefore, notAfter)
}

// renewalSchedule is when to renew leaf, just issued, and when to ask the CA about
// it again: from the CA's renewal information when it offers it (RFC 9773 asks for
// a read right after issuance), else by the lifetime (RenewAtFromValidity). The read
// takes a token of the fleet's budget (--ari-requests-per-second) like every other;
// when the budget is spent it is not made here but left to the worker's reads, due
// at once, which make it as soon as the budget allows.
func (i *Issuer) renewalSchedule(tr *orderTransport, leaf *x509.Certificate, log *zap.Logger) (at time.Time, used issuing.RenewalWindow, infoIn time.Duration, fromWindow bool) {
	if !i.renewalInfoToken(tr.ctx, log) {
		log.Debug("the fleet's renewal-information budget is spent; the worker reads the new certificate's soon")
		return RenewAtFromValidity(leaf.NotBefore, leaf.NotAfter), used, issuing.RenewalInfoSoon, false
	}
	window, err := i.renewalInfo(tr, leaf)
	switch {
	case err == nil:
		infoIn = issuing.RenewalInfoIn(window.RetryAfter)
	case errors.Is(err, issuing.ErrNoRenewalInfo):
		// The CA offers no renewal information: the lifetime rule applies.
	default:
		log.Warn("could not get the CA's renewal information; renewing by the certificate's lifetime",
			zap.String("error", truncate(err.Error())))
		infoIn = issuing.RenewalInfoRetryIn()
	}
	at, fromWindow = renewAt(leaf, window, time.Now())
	if fromWindow {
		used = issuing.RenewalWindow{Start: window.Start, End: window.End}
	}
	return at, used, infoIn, fromWindow
}

// renewalInfoToken takes a token of the fleet's renewal-information budget, and
// reports whether the read may go. Without a budget (RenewalInfoPerSecond 0) it
// always may; when the budget cannot be read (the database is down) too: one read
// per issuance is no load a CA notices.
func (i *Issuer) renewalInfoToken(ctx context.Context, log *zap.Logger) bool {
	if i.cfg.RenewalInfoPerSecond <= 0 {
		return true
	}
	got, _, err := i.cfg.Recorder.TakeRenewalInfoTokens(ctx, i.cfg.DirectoryURL, 1, i.cfg.RenewalInfoPerSecond)
	if err != nil {
		log.Warn("could not take a token of the fleet's renewal-information budget; reading without one", zap.Error(err))
		return true
	}
	return got == 1
}

// renewAt is the renewal time of a certificate just issued: from the ARI window when
// the CA gave a usable one, else the lifetime rule. fromWindow says which.
func renewAt(leaf *x509.Certificate, w *issuing.RenewalWindow, now time.Time) (at time.Time, fromWindow bool) {
	if w != nil {
		if t, ok := issuing.RenewAtFromWindow(w.Start, w.End, leaf.NotBefore, leaf.NotAfter, now); ok {
			return t, true
		}
	}
	return RenewAtFromValidity(leaf.NotBefore, leaf.NotAfter), false
}

var _ issuing.RenewalInformer = (*Issuer)(nil)

// RenewalInfo asks the CA for its suggested renewal window of the certificate
// chainPEM starts with (ACME Renewal Information, RFC 9773): the worker asks again,
// at the CA's Retry-After, for every stored certificate while it is valid, so that
// a window the CA moves earlier (a revocation coming) is acted on. It sends one GET
// (the directory comes from the Issuer's session) and needs no account.
//
// It returns issuing.ErrNoRenewalInfo when the CA offers none, or the certificate
// cannot be named to it (no authority key identifier); a *issuing.CAUnavailableError
// when the CA cannot be reached or answers 5xx; another error when the CA refuses
// the question (it does not know the certificate) or its answer is not a window.
func (i *Issuer) RenewalInfo(ctx context.Context, chainPEM string) (*issuing.RenewalWindow, error) {
	chain, err := parseChain([]byte(chainPEM))
	if err != nil {
		return nil, fmt.Errorf("renewal information: %w", err)
	}
	tr := i.orderTransport(ctx)
	w, err := i.renewalInfo(tr, chain[0])
	if err != nil && !errors.Is(err, issuing.ErrNoRenewalInfo) {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("renewal information: %w", context.Cause(ctx))
		}
		if cause := tr.unreachable(); cause != nil {
			return nil, &issuing.CAUnavailableError{Err: &failure{msg: truncate("acme: " + cause.Error()), err: cause}}
		}
	}
	return w, err
}

// renewalInfo fetches leaf's renewal information through tr.
func (i *Issuer) renewalInfo(tr *orderTransport, leaf *x509.Certificate) (*issuing.RenewalWindow, error) {
	if len(leaf.AuthorityKeyId) == 0 {
		return nil, fmt.Errorf("renewal information: the certificate has no authority key identifier to name it by: %w", issuing.ErrNoRenewalInfo)
	}
	id, err := certificate.MakeARICertID(leaf)
	if err != nil {
		return nil, fmt.Errorf("renewal information: %w", err)
	}
	hc := i.httpClient(tr)
	base, err := i.renewalInfoURL(tr.ctx, hc)
	if err != nil {
		return nil, err
	}
	if base == "" {
		return nil, issuing.ErrNoRenewalInfo
	}
	resp, err := hc.Get(strings.TrimSuffix(base, "/") + "/" + id)
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
	return &issuing.RenewalWindow{Start: w.Start, End: w.End, RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"))}, nil
}

// renewalInfoURL is the directory's renewalInfo URL, "" when the CA offers none. It
// comes from the session while the directory is fresh; otherwise one caller fetches
// the directory, through hc (whose transport keeps it in the session), while the
// others wait for it, so that the worker's concurrent reads after start (or after
// the hour a directory is kept) send the CA one directory request, not one each.
func (i *Issuer) renewalInfoURL(ctx context.Context, hc *http.Client) (string, error) {
	if u, ok := i.session.cachedRenewalInfo(time.Now()); ok {
		return u, nil
	}
	select {
	case i.session.fetching <- struct{}{}:
		defer func() { <-i.session.fetching }()
	case <-ctx.Done():
		return "", fmt.Errorf("acme: get directory: %w", context.Cause(ctx))
	}
	if u, ok := i.session.cachedRenewalInfo(time.Now()); ok {
		return u, nil
	}
	dir, err := i.directory(hc)
	if err != nil {
		return "", err
	}
	return dir.RenewalInfo, nil
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
