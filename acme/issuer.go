package acme

import (
	"context"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	legoacme "github.com/go-acme/lego/v4/acme"
	"github.com/go-acme/lego/v4/acme/api"
	"github.com/go-acme/lego/v4/certcrypto"
	"github.com/go-acme/lego/v4/certificate"
	"github.com/go-acme/lego/v4/challenge"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/certworker/certworker/queue/issuing"
)

// userAgent is sent with every request to the CA (RFC 8555 §6.1 asks for one); lego
// appends its own.
const userAgent = "certworker"

// Issuer is the issuing.Issuer that orders certificates over ACME. It is safe for
// concurrent use: each order has its own lego client and HTTP transport, which
// carries the order's context; the account, the CA's directory and its unused
// nonces are shared (session).
type Issuer struct {
	cfg       Config
	keyType   certcrypto.KeyType
	pool      *pgxpool.Pool
	log       *zap.Logger
	transport *http.Transport
	session   *session
	// preflight checks a name before it is ordered; nil with --preflight off.
	preflight *preflight
	// dns asks --preflight-resolver what the challenge's choice needs.
	dns *dnsClient
	// caa reads a name's CAA records for the choice (caaOnlyDNS01), through
	// --preflight-resolver; nil unless both the preflight and DNS-01 are on.
	caa *CAAResolver

	accountMu sync.Mutex // held while the account is loaded or registered
	account   *account   // guarded by accountMu; nil until the first order needs it
}

var _ issuing.Issuer = (*Issuer)(nil)

// New checks cfg and returns an Issuer. It does not contact the CA or the database:
// the account is loaded or registered by the first order, so a CA that is down when
// the worker starts fails orders (which the worker retries), not the start.
func New(ctx context.Context, pool *pgxpool.Pool, log *zap.Logger, cfg Config) (*Issuer, error) {
	_ = ctx // nothing to wait for yet; kept so that New may check the CA one day
	if pool == nil {
		return nil, errors.New("acme: nil database pool")
	}
	if cfg.Recorder == nil {
		return nil, errors.New("acme: nil Recorder")
	}
	if log == nil {
		log = zap.NewNop()
	}
	cfg.DirectoryURL = strings.TrimSpace(cfg.DirectoryURL)
	cfg.KeyType = strings.TrimSpace(cfg.KeyType)
	kt, roots, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	var caa *CAAResolver
	if cfg.Preflight == PreflightHTTP && cfg.DNS01Zone != "" {
		if caa, err = NewCAAResolver(cfg.PreflightResolver); err != nil {
			return nil, err
		}
	}
	routeLegoLog()
	log = log.Named("acme")
	return &Issuer{
		caa:       caa,
		cfg:       cfg,
		keyType:   kt,
		pool:      pool,
		log:       log,
		transport: newTransport(roots, cfg.httpTimeout()),
		session:   newSession(cfg.DirectoryURL),
		preflight: newPreflight(pool, log, cfg),
		dns:       newDNSClient(cfg.PreflightResolver),
	}, nil
}

// DirectoryURL is the ACME directory this issuer orders from: the key the worker
// pauses a rate-limited CA under.
func (i *Issuer) DirectoryURL() string { return i.cfg.DirectoryURL }

// Issue orders a certificate for req.Domain over HTTP-01, after the preflight.
//
// It returns promptly when ctx is cancelled, with an error wrapping ctx's. lego's
// calls take no context: the order then goes on in the background until its next
// request to the CA, which fails at once (every request carries ctx); its HTTP-01
// token is deleted and its pending authorizations are deactivated.
//
// req.Deadline is enforced by the order's transport: nothing is sent to the CA once
// it has passed (no finalize, and no deactivation either), and each request ends at
// it; such an order returns an error wrapping issuing.ErrLeaseDeadline. Its HTTP-01
// token is written under req.ClaimToken (tokenStore).
//
// Errors are typed as issuing.Issuer asks (see classify); none holds key material,
// nor the database's errors, key ids or the CA's unpause link, which go to the log
// (forTenant); and nothing panics: a panic inside lego is turned into an error.
func (i *Issuer) Issue(ctx context.Context, req issuing.Request) (*issuing.Certificate, error) {
	if req.Domain == "" {
		return nil, errors.New("acme: empty domain")
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("acme: order for %s not started: %w", req.Domain, err)
	}
	type result struct {
		cert *issuing.Certificate
		err  error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		defer func() {
			if p := recover(); p != nil {
				// The panic value comes from lego or the CA's answer, never from a key.
				r = result{err: &failure{msg: truncate(fmt.Sprintf("acme: internal error in the ACME client: %v", p))}}
			}
			done <- r
		}()
		r.cert, r.err = i.issue(ctx, req)
	}()
	select {
	case r := <-done:
		return r.cert, i.forTenant(r.err, req)
	case <-ctx.Done():
		// An order that finished as the context ended is not thrown away.
		select {
		case r := <-done:
			return r.cert, i.forTenant(r.err, req)
		default:
		}
		return nil, fmt.Errorf("acme: order for %s abandoned: %w", req.Domain, context.Cause(ctx))
	}
}

// issue is one order, start to end.
func (i *Issuer) issue(ctx context.Context, req issuing.Request) (*issuing.Certificate, error) {
	log := i.log.With(issuing.LogDomain(req.Domain, req.DomainID, req.TenantID))
	choice, err := i.choose(ctx, req.Domain)
	if err != nil {
		return nil, i.waiting(ctx, req.Domain, err)
	}
	i.recordChallenge(ctx, req, choice, log)
	if i.preflight != nil && choice.challenge == issuing.ChallengeHTTP01 {
		if msg, off := i.offTarget(ctx, req.Domain); off {
			return nil, &issuing.WaitingError{Msg: i.waitMessage(req.Domain, msg), Answer: i.dnsAnswer(ctx, req.Domain)}
		}
		if err := i.preflight.check(ctx, req.Domain); err != nil {
			return nil, i.waiting(ctx, req.Domain, err)
		}
	}
	profile := req.Profile
	if profile == "" {
		profile = i.cfg.Profile
	}
	offered, err := i.checkProfile(ctx, profile)
	if err != nil {
		return nil, err
	}
	tr := i.orderTransport(ctx)
	tr.deadline = req.Deadline
	acct, err := i.accountFor(ctx, tr)
	if err != nil {
		var refused *EABRefusedError
		if errors.As(err, &refused) && ctx.Err() == nil {
			// The operator's binding, not the name: nothing charged, the CA paused.
			return nil, &issuing.CAUnavailableError{Err: refused}
		}
		return nil, i.fail(ctx, err, tr)
	}
	core, err := i.newCore(acct, tr)
	if err != nil {
		return nil, i.fail(ctx, err, tr)
	}
	key, err := certcrypto.GeneratePrivateKey(i.keyType)
	if err != nil {
		return nil, fmt.Errorf("acme: generate %s key: %w", i.keyType, err)
	}
	replaces := replacesCertID(req.CurrentPEM, log)
	book := &orderBook{pool: i.pool, log: log, directory: i.cfg.DirectoryURL, domainID: req.DomainID, claim: req.ClaimToken}
	rec, err := book.load(ctx)
	if err != nil {
		return nil, err
	}
	if rec != nil && replaces != "" && rec.ReplacesRefused == replaces && rec.URL == "" &&
		!time.Now().Before(thirdLeftAt(req.CurrentPEM)) {
		// The CA would not see the certificate replaced again, and a third of its
		// lifetime is left: it is ordered without the name, as a new order.
		log.Info("ordering the renewal without naming the certificate it replaces: the CA refused to see it replaced again, and a third of its lifetime is left")
		if req.Readmit != nil {
			if err := req.Readmit(ctx); err != nil {
				return nil, err
			}
		}
		replaces = ""
	}
	var tokens challenge.Provider = &tokenStore{pool: i.pool, log: log, ctx: ctx, claim: req.ClaimToken}
	if choice.challenge == issuing.ChallengeDNS01 {
		tokens = &valueStore{pool: i.pool, log: log, ctx: ctx, zone: i.cfg.DNS01Zone, claim: req.ClaimToken}
	}
	o := &order{
		core: core, tr: tr, ctx: ctx, log: log, domain: req.Domain,
		challenge:       choice.legoType(),
		tokens:          tokens,
		finalizeTimeout: max(30*time.Second, i.cfg.httpTimeout()),
		authz:           map[string]string{},
		confirm:         req.ConfirmClaim,
		book:            book,
		seal:            func(k crypto.PrivateKey) (string, error) { return i.sealKey(k, req.Domain) },
	}
	var chainPEM []byte
	resumed := false
	if rec != nil && rec.URL != "" {
		var used crypto.PrivateKey
		chainPEM, used, resumed, err = o.resume(rec, key, func(s string) (crypto.PrivateKey, error) { return i.openKey(s, req.Domain) })
		if resumed && used != nil {
			key = used
		}
	}
	if !resumed {
		log.Debug("placing ACME order", zap.Bool("renewal", replaces != ""), zap.String("profile", profile))
		chainPEM, err = o.run(key, replaces, profile)
	}
	var refused *replacesRefusedError
	if errors.As(err, &refused) {
		return nil, i.replacesRefused(ctx, book, replaces, req, refused, tr, log)
	}
	if err != nil {
		i.release(ctx, acct, o)
		switch problemType(err) {
		case problemAccountDoesNotExist:
			i.forgetAccount(context.WithoutCancel(ctx), acct)
		case problemInvalidProfile:
			if ctx.Err() == nil {
				return nil, &issuing.ProfileError{Profile: profile, Offered: offered, Detail: problemDetailOf(err)}
			}
		}
		return nil, i.fail(ctx, err, tr)
	}
	cert, err := i.certificate(req.Domain, chainPEM, key, tr, log)
	if err != nil {
		return nil, err
	}
	// The profile the CA says the order has; Pebble, and a CA that picks one for an
	// order naming none, say so.
	cert.Profile = o.placed.Profile
	if cert.Profile == "" {
		cert.Profile = profile
	}
	return cert, nil
}

// replacesRefused records that the CA refused to see the certificate replaced again
// and pauses the name: until a third of its lifetime is left, after which it is
// ordered without "replaces", or replacesRetry, after which the CA is asked again.
func (i *Issuer) replacesRefused(ctx context.Context, book *orderBook, id string, req issuing.Request, refused *replacesRefusedError, tr *orderTransport, log *zap.Logger) error {
	if err := i.fail(ctx, refused.cause, tr); ctx.Err() != nil || errors.Is(err, issuing.ErrLeaseDeadline) || errors.Is(err, issuing.ErrClaimLost) {
		return err
	}
	book.recordRefusal(ctx, id)
	wait := min(replacesRetry, max(time.Until(thirdLeftAt(req.CurrentPEM)), 0))
	detail := problemDetailOf(refused.cause)
	if detail == "" {
		detail = "it holds another order replacing it"
	}
	log.Info("the CA refused the renewal's order naming the certificate it replaces; nothing more sent, the name waits",
		zap.String("problem", detail), zap.Duration("retry_in", wait))
	return &issuing.ReplacesRefusedError{RetryAfter: wait, Detail: truncate(detail)}
}

// recordChallenge records the challenge chosen for `status DOMAIN`; a failure to
// record it is logged and does not stop the order.
func (i *Issuer) recordChallenge(ctx context.Context, req issuing.Request, c challengeChoice, log *zap.Logger) {
	if req.DomainID == "" || i.cfg.DNS01Zone == "" {
		return // without DNS-01, every order is HTTP-01
	}
	if err := i.cfg.Recorder.RecordChallenge(ctx, req.DomainID, c.challenge, c.reason); err != nil {
		log.Warn("could not record the challenge chosen", zap.Error(err))
	}
	log.Debug("challenge chosen", zap.String("challenge", c.challenge), zap.String("reason", c.reason))
}

// checkProfile refuses, before any order or account request is sent, an order naming
// a profile the CA's directory does not list in meta.profiles, and
// returns the profiles it lists, sorted, for a refusal later. The directory is the
// session's (one GET an hour). It returns nil, nil when the directory cannot be read,
// or is not an ACME directory: the order goes ahead and meets the same trouble, which
// is classified there. The question has a transport of its own, so that what it met
// does not count as the order's.
func (i *Issuer) checkProfile(ctx context.Context, profile string) ([]string, error) {
	dir, err := i.directory(i.httpClient(i.orderTransport(ctx)))
	if err != nil || dir.NewOrderURL == "" {
		return nil, nil
	}
	offered := offeredProfiles(dir)
	if profile != "" && !slices.Contains(offered, profile) {
		return offered, &issuing.ProfileError{Profile: profile, Offered: offered}
	}
	return offered, nil
}

// offeredProfiles are the names of the profiles a directory lists, sorted; empty (not
// nil) for a CA that lists none.
func offeredProfiles(dir legoacme.Directory) []string {
	return slices.Sorted(maps.Keys(dir.Meta.Profiles))
}

// Profiles are the ACME profiles the CA offers (its directory's meta.profiles),
// sorted: `run` checks --acme-profile against them at start. The directory is the one
// every order uses (fetched when the session has none fresh). The error is a
// *issuing.CAUnavailableError when the CA cannot be reached or answers 5xx.
func (i *Issuer) Profiles(ctx context.Context) ([]string, error) {
	dir, err := i.sharedDirectory(ctx)
	if err != nil {
		return nil, err
	}
	return offeredProfiles(dir), nil
}

// sharedDirectory is the directory every order uses (fetched when the session has
// none fresh). The error is a *issuing.CAUnavailableError when the CA cannot be
// reached or answers 5xx.
func (i *Issuer) sharedDirectory(ctx context.Context) (legoacme.Directory, error) {
	tr := i.orderTransport(ctx)
	dir, err := i.directory(i.httpClient(tr))
	if err != nil {
		if cause := tr.unreachable(); cause != nil {
			return dir, &issuing.CAUnavailableError{Err: &failure{msg: truncate("acme: " + cause.Error()), err: cause}}
		}
		return dir, err
	}
	return dir, nil
}

// DefaultProfile is --acme-profile: the profile of an order whose request names none.
func (i *Issuer) DefaultProfile() string { return i.cfg.Profile }

// release deactivates what a failed order may have left pending at the CA, on a
// context of its own: the order's may have ended (the worker gave it up). Not past
// the lease deadline: another instance may have reclaimed the domain and be ordering
// it, and an authorization the CA reuses for its order (Let's Encrypt reuses pending
// ones) would be deactivated under it.
func (i *Issuer) release(ctx context.Context, acct *account, o *order) {
	if len(o.placed.Authorizations) == 0 {
		return
	}
	if o.tr.deadline.Check() != nil {
		o.log.Debug("not deactivating the stopped order's authorizations: its lease deadline has passed; they expire by themselves")
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	rtr := i.orderTransport(cctx)
	rtr.deadline = o.tr.deadline
	core, err := i.newCore(acct, rtr)
	if err != nil {
		o.log.Info("could not deactivate the failed order's authorizations; they expire by themselves",
			zap.String("error", truncate(err.Error())))
		return
	}
	if n := o.release(core); n > 0 {
		o.log.Debug("deactivated the failed order's pending authorizations", zap.Int("authorizations", n))
	}
}

// certificate checks the CA's chain and builds what the queue stores: the sealed
// key, and when to renew and to ask the CA again.
func (i *Issuer) certificate(domain string, chainPEM []byte, key crypto.PrivateKey, tr *orderTransport, log *zap.Logger) (*issuing.Certificate, error) {
	chain, err := parseChain(chainPEM)
	if err != nil {
		return nil, err
	}
	leaf := chain[0]
	if err := checkLeaf(leaf, domain, key); err != nil {
		return nil, err
	}
	at, window, infoIn, fromWindow := i.renewalSchedule(tr, leaf, log)

	sealed, err := i.sealKey(key, domain)
	if err != nil {
		return nil, err
	}
	var out strings.Builder
	for _, c := range chain {
		_ = pem.Encode(&out, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	cert := &issuing.Certificate{
		ChainPEM:      out.String(),
		PrivateKey:    sealed,
		NotBefore:     leaf.NotBefore,
		NotAfter:      leaf.NotAfter,
		Issuer:        leaf.Issuer.String(),
		Serial:        leaf.SerialNumber.Text(16),
		RenewAt:       at,
		WindowStart:   window.Start,
		WindowEnd:     window.End,
		RenewalInfoIn: infoIn,
	}
	log.Debug("certificate obtained",
		zap.String("serial", cert.Serial), zap.Time("not_after", cert.NotAfter),
		zap.Time("renew_at", cert.RenewAt), zap.Bool("renew_at_from_ari", fromWindow))
	return cert, nil
}

// orderTransport is a transport for one order, or one question to the CA, on ctx.
func (i *Issuer) orderTransport(ctx context.Context) *orderTransport {
	return &orderTransport{base: i.transport, ctx: ctx, session: i.session}
}

// httpClient is a client on tr. lego wraps the transport of the client it is
// given, so every lego core gets a client of its own.
func (i *Issuer) httpClient(tr *orderTransport) *http.Client {
	return &http.Client{Transport: tr, Timeout: i.cfg.httpTimeout()}
}

// newCore is lego's protocol layer for acct on tr. The directory it fetches comes
// from the session while it is fresh, so a core costs the CA nothing.
func (i *Issuer) newCore(acct *account, tr *orderTransport) (*api.Core, error) {
	var kid string
	if acct.reg != nil {
		kid = acct.reg.URI
	}
	core, err := api.New(i.httpClient(tr), userAgent, i.cfg.DirectoryURL, kid, acct.key)
	if err != nil {
		return nil, err
	}
	return core, nil
}

// fail classifies an order's error; a cancelled order, or one stopped by its lease
// deadline, says so, whatever lego made of its failing requests.
func (i *Issuer) fail(ctx context.Context, err error, tr *orderTransport) error {
	if ctx.Err() != nil {
		return fmt.Errorf("acme: order abandoned: %w", context.Cause(ctx))
	}
	if derr := tr.deadline.Check(); derr != nil {
		return fmt.Errorf("acme: order stopped: %w", derr)
	}
	if errors.Is(err, issuing.ErrLeaseDeadline) || errors.Is(err, issuing.ErrClaimLost) {
		return fmt.Errorf("acme: order stopped: %w", err) // the claim could not be confirmed
	}
	return classify(err, tr)
}

// replacesCertID is the RFC 9773 id of the certificate a renewal replaces, or "" for
// a first issuance or a stored chain that cannot be read (the renewal goes ahead
// without naming it).
func replacesCertID(currentPEM string, log *zap.Logger) string {
	if strings.TrimSpace(currentPEM) == "" {
		return ""
	}
	chain, err := parseChain([]byte(currentPEM))
	if err != nil {
		log.Info("stored certificate unreadable; renewing without naming it", zap.String("error", err.Error()))
		return ""
	}
	id, err := certificate.MakeARICertID(chain[0])
	if err != nil || len(chain[0].AuthorityKeyId) == 0 {
		// Without an authority key id the RFC 9773 id is meaningless.
		return ""
	}
	return id
}

// parseChain reads a PEM chain, leaf first. Only CERTIFICATE blocks count; there must
// be at least one, and the first must not be a CA.
func parseChain(pemBytes []byte) ([]*x509.Certificate, error) {
	var chain []*x509.Certificate
	rest := pemBytes
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("acme: the CA's certificate does not parse: %w", err)
		}
		chain = append(chain, c)
	}
	if len(chain) == 0 {
		return nil, errors.New("acme: the CA returned no certificate")
	}
	if chain[0].IsCA {
		return nil, errors.New("acme: the CA's chain starts with a CA certificate, not the leaf")
	}
	return chain, nil
}

// checkLeaf makes sure the CA's certificate is the one ordered: for the domain, and
// for the key the order's CSR was made with. A mismatch would put a certificate that
// cannot serve the domain into the proxy.
func checkLeaf(leaf *x509.Certificate, domain string, key crypto.PrivateKey) error {
	if err := leaf.VerifyHostname(domain); err != nil {
		return fmt.Errorf("acme: the CA's certificate does not cover %s: %w", domain, err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return errors.New("acme: certificate key is not a signer")
	}
	pub, ok := signer.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(leaf.PublicKey) {
		return errors.New("acme: the CA's certificate is not for the order's key")
	}
	return nil
}
