package acme

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	legoacme "github.com/go-acme/lego/v4/acme"
	"github.com/go-acme/lego/v4/acme/api"
	"github.com/go-acme/lego/v4/certcrypto"
	"github.com/go-acme/lego/v4/challenge"
	"go.uber.org/zap"
)

const (
	// validationTimeout bounds the wait for the CA to decide a challenge. A CA
	// validates within seconds; one that keeps an authorization pending for
	// minutes will not decide it, and the order is failed (and retried) rather
	// than held until --order-timeout.
	validationTimeout = 5 * time.Minute
	// cleanupTimeout bounds the deactivation of a failed order's authorizations,
	// which runs on its own context: the order's may have ended.
	cleanupTimeout = 30 * time.Second
	// maxCommonNameLen is RFC 5280's upper bound on a common name; a longer name
	// goes in the SAN only, as lego does.
	maxCommonNameLen = 64
)

// order is one ACME order for one name, driven step by step on lego's protocol
// layer (api.Core, which signs, handles nonces and parses problems) rather than
// lego's Certifier.Obtain, which hides the order: with Obtain, a failed or cancelled
// order's authorizations could not be deactivated, a failed validation could not be
// told from a refused order, and the waits between polls ignored cancellation.
//
// Its methods run on one goroutine; the core's HTTP client carries the order's
// context.
type order struct {
	core *api.Core
	tr   *orderTransport
	// challenge is the type answered (challengeChoice), and tokens where its
	// values go: certworker_http01_tokens or certworker_dns01_values.
	challenge       challenge.Type
	tokens          challenge.Provider
	ctx             context.Context
	log             *zap.Logger
	domain          string
	finalizeTimeout time.Duration
	// confirm is the worker's check that the claim is still held (issuing.Request's
	// ConfirmClaim), or nil.
	confirm func(context.Context) error

	// placed is the CA's order, once accepted.
	placed legoacme.ExtendedOrder
	// authz is the last status seen of each of its authorizations, by URL.
	authz map[string]string
	// book records the order and its key for whoever takes the domain next.
	book *orderBook
	// seal is the key as stored (Issuer.sealKey).
	seal func(crypto.PrivateKey) (string, error)
}

// run places the order, answers its challenge and returns the certificate chain
// (PEM, leaf first) for key. replaces names the certificate a renewal replaces
// (RFC 9773), or is "".
func (o *order) run(key crypto.PrivateKey, replaces, profile string) ([]byte, error) {
	if err := o.place(replaces, profile); err != nil {
		return nil, err
	}
	if err := o.authorize(); err != nil {
		return nil, err
	}
	return o.finalize(key)
}

// place sends the new-order request, once, and records the order the CA accepted.
// A renewal that the CA refuses because of its "replaces" (it holds a replacement
// order already, alreadyReplaced, or does not know the certificate: another
// account's, one uploaded by hand, its database reset) is not ordered again without
// it here: that order would count against every limit the renewal is exempt from.
// lego's own answer to alreadyReplaced, posting the order again without
// "replaces", is refused by the order's transport (errSecondNewOrder).
func (o *order) place(replaces, profile string) error {
	opts := &api.OrderOptions{Profile: profile, ReplacesCertID: replaces}
	placed, err := o.core.Orders.NewWithOptions([]string{o.domain}, opts)
	if err != nil {
		if replaces != "" && (o.tr.refusedSecondOrder() || refusesReplaces(err)) {
			return &replacesRefusedError{cause: err}
		}
		return err
	}
	o.placed = placed
	return o.book.recordOrder(o.ctx, placed.Location, replaces)
}

// replacesRefusedError: the CA refused the order naming the certificate it replaces.
type replacesRefusedError struct{ cause error }

func (e *replacesRefusedError) Error() string {
	return "the CA refused the order naming the certificate it replaces: " + e.cause.Error()
}
func (e *replacesRefusedError) Unwrap() error { return e.cause }

// refusesReplaces reports whether a new-order request naming a replaced certificate
// failed in a way that ordering without it may fix: the CA answered it with a
// problem document (4xx, or serverInternal: Pebble's answer to a certificate it
// does not know) that is not a rate limit, a pause, a refusal of the name or of the
// profile, or a lost account.
func refusesReplaces(err error) bool {
	var pd *legoacme.ProblemDetails
	if !errors.As(err, &pd) || pd == nil || pd.URL == "" {
		return false
	}
	if _, paused := unpauseLink(pd.Detail); paused || isPermanent(pd) {
		return false
	}
	switch {
	case pd.Type == problemRateLimited || pd.HTTPStatus == http.StatusTooManyRequests:
		return false
	case pd.Type == problemAccountDoesNotExist, pd.Type == problemInvalidProfile:
		return false
	case pd.Type == problemServerInternal:
		return true
	}
	return pd.HTTPStatus >= 400 && pd.HTTPStatus < 500
}

// authorize answers the chosen challenge of each authorization not yet valid.
func (o *order) authorize() error {
	for _, u := range o.placed.Authorizations {
		a, err := o.fetch(u)
		if err != nil {
			return err
		}
		switch a.Status {
		case legoacme.StatusValid:
			continue
		case legoacme.StatusPending:
			if err := o.solve(u, a); err != nil {
				return err
			}
		case legoacme.StatusInvalid:
			return &validationFailure{err: authzProblem(a)}
		default:
			return fmt.Errorf("acme: the authorization for %s is %s", o.domain, a.Status)
		}
	}
	return nil
}

// fetch gets the authorization at u, and remembers its status.
func (o *order) fetch(u string) (legoacme.Authorization, error) {
	a, err := o.core.Authorizations.Get(u)
	if err == nil {
		o.authz[u] = a.Status
	}
	return a, err
}

// solve stores the challenge's token where every instance's responder finds it,
// tells the CA to validate, and waits for its verdict. The token is deleted when
// the CA has decided, or the order gave up.
func (o *order) solve(u string, a legoacme.Authorization) error {
	chlg, err := challenge.FindChallenge(o.challenge, a)
	if err != nil {
		return fmt.Errorf("acme: %w", err)
	}
	keyAuth, err := o.core.GetKeyAuthorization(chlg.Token)
	if err != nil {
		return fmt.Errorf("acme: key authorization: %w", err)
	}
	if err := o.tokens.Present(o.domain, chlg.Token, keyAuth); err != nil {
		return err
	}
	// CleanUp logs its own failure; the token expires by itself.
	defer o.tokens.CleanUp(o.domain, chlg.Token, keyAuth) //nolint:errcheck
	answered, err := o.core.Challenges.New(chlg.URL)
	if err != nil {
		return err
	}
	switch answered.Status {
	case legoacme.StatusValid:
		o.authz[u] = legoacme.StatusValid
		return nil
	case legoacme.StatusInvalid:
		// The CA decided before it answered: the authorization is over, and
		// release must not deactivate it.
		o.authz[u] = legoacme.StatusInvalid
		return &validationFailure{err: challengeProblem(answered.Challenge)}
	}
	return o.awaitValidation(u, parseRetryAfter(answered.RetryAfter))
}

// awaitValidation polls the authorization at u until the CA has decided it;
// retryAfter is the Retry-After of the CA's answer to the challenge, or 0.
func (o *order) awaitValidation(u string, retryAfter time.Duration) error {
	p := newPoll(authzFirstLook)
	deadline := time.Now().Add(validationTimeout)
	for {
		if err := sleep(o.ctx, p.next(time.Now(), retryAfter)); err != nil {
			return err
		}
		p.sent(u)
		a, err := o.fetch(u)
		if err != nil {
			return err
		}
		switch a.Status {
		case legoacme.StatusValid:
			return nil
		case legoacme.StatusInvalid:
			return &validationFailure{err: authzProblem(a)}
		case legoacme.StatusPending, legoacme.StatusProcessing:
		default:
			return fmt.Errorf("acme: the authorization for %s became %s", o.domain, a.Status)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("acme: the CA did not decide the challenge for %s within %s", o.domain, validationTimeout)
		}
		retryAfter = o.tr.lastRetryAfter()
	}
}

// finalize sends the CSR for key, waits for the CA to issue, and downloads the
// chain.
func (o *order) finalize(key crypto.PrivateKey) ([]byte, error) {
	opts := certcrypto.CSROptions{SAN: []string{o.domain}}
	if len(o.domain) <= maxCommonNameLen {
		opts.Domain = o.domain
	}
	csr, err := certcrypto.CreateCSR(key, opts)
	if err != nil {
		return nil, fmt.Errorf("acme: create CSR: %w", err)
	}
	if err := finalizeAllowed(o.ctx, o.tr.deadline, o.confirm); err != nil {
		return nil, err
	}
	if !o.book.off() {
		sealed, err := o.seal(key)
		if err != nil {
			return nil, err
		}
		if err := o.book.recordKey(o.ctx, o.placed.Location, sealed); err != nil {
			return nil, err
		}
	}
	state, err := o.core.Orders.UpdateForCSR(o.placed.Finalize, csr)
	if err != nil {
		return nil, err
	}
	return o.download(state)
}

// download waits for the CA to issue the order in state and downloads the chain.
func (o *order) download(state legoacme.ExtendedOrder) ([]byte, error) {
	deadline := time.Now().Add(o.finalizeTimeout)
	p := newPoll(orderFirstLook)
	for state.Status != legoacme.StatusValid {
		if state.Status == legoacme.StatusInvalid {
			return nil, orderProblem(state)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("acme: the CA did not issue the certificate for %s within %s (order %s)", o.domain, o.finalizeTimeout, state.Status)
		}
		if err := sleep(o.ctx, p.next(time.Now(), o.tr.lastRetryAfter())); err != nil {
			return nil, err
		}
		p.sent(o.placed.Location)
		var err error
		if state, err = o.core.Orders.Get(o.placed.Location); err != nil {
			return nil, err
		}
	}
	chain, _, err := o.core.Certificates.Get(state.Certificate, true)
	return chain, err
}

// finalizeAllowed refuses a finalize with less than a third of the lease left before
// the claim's deadline. A finalize makes the CA issue the certificate; an order
// stopped by its deadline between the finalize and the download leaves a certificate
// issued that nobody stores, and the domain is ordered again: two certificates
// against the CA's limits (Let's Encrypt allows 5 a week for the same names). A
// healthy heartbeat keeps more than 60% of the lease ahead of an order (it renews
// every third, and the deadline keeps back a twentieth), so less than a third left
// means renewals are failing, and the order stops here instead, handed back
// uncharged, with a third of the lease (20 s of the default 60) unused.
//
// The local deadline cannot tell that the database itself no longer holds the claim:
// after a failover to a standby that had not received it, the row is pending again
// and another instance may be ordering it. So confirm, the worker's renewal of the
// lease under the claim's token, runs first, and its renewal moves the deadline.
func finalizeAllowed(ctx context.Context, d *issuing.Deadline, confirm func(context.Context) error) error {
	if confirm != nil {
		if err := confirm(ctx); err != nil {
			return fmt.Errorf("acme: not finalizing: %w", err)
		}
	}
	if d == nil {
		return nil
	}
	if left := d.Left(); left < d.Lease()/3 {
		return fmt.Errorf("acme: not finalizing with %s left before the lease deadline (renewals are failing): %w",
			max(left, 0).Round(time.Millisecond), issuing.ErrLeaseDeadline)
	}
	return nil
}

// release deactivates the authorizations of a failed order that may still be
// pending at the CA (RFC 8555 §7.5.2): a pending authorization counts against the
// CA's limits until it expires, days later. Valid ones are kept (the next order
// for the name reuses them), invalid ones are over already. core is not the
// order's: the order's context may have ended. It returns how many it
// deactivated.
func (o *order) release(core *api.Core) int {
	n := 0
	for _, u := range o.placed.Authorizations {
		switch o.authz[u] {
		case legoacme.StatusValid, legoacme.StatusInvalid, legoacme.StatusDeactivated,
			legoacme.StatusExpired, legoacme.StatusRevoked:
			continue
		}
		if err := core.Authorizations.Deactivate(u); err != nil {
			o.log.Info("could not deactivate an authorization of the failed order; it expires by itself",
				zap.String("authorization", u), zap.String("error", truncate(err.Error())))
			continue
		}
		o.authz[u] = legoacme.StatusDeactivated
		n++
	}
	return n
}

// challengeProblem is why the CA marked a challenge invalid.
func challengeProblem(c legoacme.Challenge) error {
	if c.Error != nil {
		return c.Error
	}
	return errors.New("acme: the CA marked the challenge invalid without saying why")
}

// authzProblem is why the CA marked an authorization invalid: the problem of its
// invalid challenge.
func authzProblem(a legoacme.Authorization) error {
	for _, c := range a.Challenges {
		if c.Status == legoacme.StatusInvalid && c.Error != nil {
			return c.Error
		}
	}
	return errors.New("acme: the CA marked the authorization invalid without saying why")
}

// orderProblem is why the CA marked an order invalid after finalize.
func orderProblem(o legoacme.ExtendedOrder) error {
	if o.Error != nil {
		return o.Error
	}
	return errors.New("acme: the CA marked the order invalid without saying why")
}

// sleep waits d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// resume goes on with the order rec records, from where the CA says it stands:
// pending, it is validated again; ready, finalized with the recorded key (or a new
// one); processing or valid, its certificate is fetched, which needs the recorded
// key. An order the CA no longer has, or has ended (invalid, expired), or whose key
// does not open, is forgotten, and resumed is false: a new order is placed. key is
// the key the chain is for.
func (o *order) resume(rec *orderRecord, key crypto.PrivateKey, open func(string) (crypto.PrivateKey, error)) (chain []byte, used crypto.PrivateKey, resumed bool, err error) {
	state, err := o.core.Orders.Get(rec.URL)
	if err != nil {
		var pd *legoacme.ProblemDetails
		if errors.As(err, &pd) && pd.HTTPStatus >= 400 && pd.HTTPStatus < 500 {
			o.log.Info("the recorded order is gone at the CA; placing a new one", zap.String("problem", problemDetail(pd)))
			o.book.forget(o.ctx, rec.URL)
			return nil, nil, false, nil
		}
		return nil, nil, false, err
	}
	state.Location = rec.URL
	var recorded crypto.PrivateKey
	if rec.KeyPEM != "" {
		if recorded, err = open(rec.KeyPEM); err != nil {
			o.log.Info("the recorded order's key does not open; placing a new order", zap.Error(err))
			recorded = nil
		}
	}
	switch state.Status {
	case legoacme.StatusPending, legoacme.StatusReady:
		o.placed = state
		if recorded != nil {
			key = recorded
		}
		o.log.Info("resuming the recorded order", zap.String("status", state.Status))
		if state.Status == legoacme.StatusPending {
			if err := o.authorize(); err != nil {
				return nil, nil, true, err
			}
		}
		chain, err := o.finalize(key)
		return chain, key, true, err
	case legoacme.StatusProcessing, legoacme.StatusValid:
		if recorded == nil {
			break
		}
		o.placed = state
		o.log.Info("resuming the recorded order: fetching its certificate", zap.String("status", state.Status))
		chain, err := o.download(state)
		return chain, recorded, true, err
	}
	o.log.Info("the recorded order is over at the CA; placing a new one", zap.String("status", state.Status))
	o.book.forget(o.ctx, rec.URL)
	return nil, nil, false, nil
}
