package acme

import (
	"context"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	legoapi "github.com/go-acme/lego/v4/acme/api"
	"github.com/go-acme/lego/v4/certcrypto"
	"github.com/go-acme/lego/v4/certificate"
	"github.com/go-acme/lego/v4/challenge"
	"github.com/go-acme/lego/v4/lego"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/certworker/certworker/queue"
)

// userAgent is sent with every request to the CA (RFC 8555 §6.1 asks for one); lego
// appends its own.
const userAgent = "certworker"

// Issuer is the queue.Issuer that orders certificates over ACME. It is safe for
// concurrent use: each order has its own lego client and HTTP transport context, and
// the account is shared.
type Issuer struct {
	cfg       Config
	keyType   certcrypto.KeyType
	pool      *pgxpool.Pool
	log       *zap.Logger
	transport *http.Transport

	accountMu sync.Mutex // held while the account is loaded or registered
	account   *account   // guarded by accountMu; nil until the first order needs it
}

var _ queue.Issuer = (*Issuer)(nil)

// New checks cfg and returns an Issuer. It does not contact the CA or the database:
// the account is loaded or registered by the first order, so a CA that is down when
// the worker starts fails orders (which the worker retries), not the start.
func New(ctx context.Context, pool *pgxpool.Pool, log *zap.Logger, cfg Config) (*Issuer, error) {
	_ = ctx // nothing to wait for yet; kept so that New may check the CA one day
	if pool == nil {
		return nil, errors.New("acme: nil database pool")
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
	routeLegoLog()
	return &Issuer{
		cfg:       cfg,
		keyType:   kt,
		pool:      pool,
		log:       log.Named("acme"),
		transport: newTransport(roots, cfg.httpTimeout()),
	}, nil
}

// DirectoryURL is the ACME directory this issuer orders from: the key the worker
// pauses a rate-limited CA under.
func (i *Issuer) DirectoryURL() string { return i.cfg.DirectoryURL }

// Issue orders a certificate for req.Domain over HTTP-01.
//
// It returns promptly when ctx is cancelled, with an error wrapping ctx's. lego's
// calls take no context: the order then goes on in the background until its next
// request to the CA, which fails at once (every request carries ctx), and its
// HTTP-01 token is deleted by CleanUp.
//
// A rate limit is a *queue.RateLimitError; a CA's problem document is an *Error; any
// other failure is a plain error. None holds key material, and nothing panics: a
// panic inside lego is turned into an error.
func (i *Issuer) Issue(ctx context.Context, req queue.Request) (*queue.Certificate, error) {
	if req.Domain == "" {
		return nil, errors.New("acme: empty domain")
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("acme: order for %s not started: %w", req.Domain, err)
	}
	type result struct {
		cert *queue.Certificate
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
		return r.cert, r.err
	case <-ctx.Done():
		// An order that finished as the context ended is not thrown away.
		select {
		case r := <-done:
			return r.cert, r.err
		default:
		}
		return nil, fmt.Errorf("acme: order for %s abandoned: %w", req.Domain, context.Cause(ctx))
	}
}

// issue is one order, start to end.
func (i *Issuer) issue(ctx context.Context, req queue.Request) (*queue.Certificate, error) {
	log := i.log.With(zap.String("domain", req.Domain), zap.String("domain_id", req.DomainID))
	tr := &orderTransport{base: i.transport, ctx: ctx}
	hc := &http.Client{Transport: tr, Timeout: i.cfg.httpTimeout()}

	acct, err := i.accountFor(ctx, hc)
	if err != nil {
		return nil, i.fail(ctx, err, tr)
	}
	client, err := i.newClient(acct, hc)
	if err != nil {
		return nil, i.fail(ctx, err, tr)
	}
	tokens := &tokenStore{pool: i.pool, log: log, ctx: ctx}
	if err := client.Challenge.SetHTTP01Provider(tokens); err != nil {
		return nil, fmt.Errorf("acme: %w", err)
	}
	// HTTP-01 only: the worker answers no other challenge type.
	client.Challenge.Remove(challenge.DNS01)
	client.Challenge.Remove(challenge.TLSALPN01)

	key, err := certcrypto.GeneratePrivateKey(i.keyType)
	if err != nil {
		return nil, fmt.Errorf("acme: generate %s key: %w", i.keyType, err)
	}
	replaces := replacesCertID(req.CurrentPEM, log)
	obtain := certificate.ObtainRequest{
		Domains:        []string{req.Domain},
		PrivateKey:     key,
		Bundle:         true,
		Profile:        i.cfg.Profile,
		ReplacesCertID: replaces,
	}
	log.Debug("placing ACME order", zap.Bool("renewal", replaces != ""), zap.String("profile", i.cfg.Profile))
	res, err := client.Certificate.Obtain(obtain)
	if err != nil && replaces != "" && retryWithoutReplaces(ctx, err, tokens) {
		// A CA may refuse "replaces" for a certificate it does not know (another
		// account's, one uploaded by hand, the CA's database reset). Naming the
		// replaced certificate only buys a renewal exemption from rate limits, so it
		// is not worth failing the renewal over.
		log.Info("CA refused the order naming the certificate it replaces; ordering without",
			zap.String("error", classify(err, tr).Error()))
		obtain.ReplacesCertID = ""
		res, err = client.Certificate.Obtain(obtain)
	}
	if err != nil {
		if problemType(err) == problemAccountDoesNotExist {
			i.forgetAccount(context.WithoutCancel(ctx), acct)
		}
		return nil, i.fail(ctx, err, tr)
	}
	if res == nil {
		return nil, errors.New("acme: the ACME client returned no certificate and no error")
	}

	chain, err := parseChain(res.Certificate)
	if err != nil {
		return nil, err
	}
	leaf := chain[0]
	if err := checkLeaf(leaf, req.Domain, key); err != nil {
		return nil, err
	}

	var windowStart, windowEnd time.Time
	info, err := client.Certificate.GetRenewalInfo(certificate.RenewalInfoRequest{Cert: leaf})
	switch {
	case err == nil && info != nil:
		windowStart, windowEnd = info.SuggestedWindow.Start, info.SuggestedWindow.End
	case errors.Is(err, legoapi.ErrNoARI):
		// The CA offers no renewal information: the lifetime rule applies.
	case err != nil:
		log.Warn("could not get the CA's renewal information; renewing when a third of the lifetime remains",
			zap.String("error", truncate(err.Error())))
	}
	at, source := renewAt(leaf, windowStart, windowEnd, time.Now())

	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("acme: encode certificate key: %w", err)
	}
	sealed, err := i.cfg.KeyEncryptionKeys.Seal(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), req.Domain)
	if err != nil {
		return nil, fmt.Errorf("acme: %w", err)
	}
	var chainPEM strings.Builder
	for _, c := range chain {
		_ = pem.Encode(&chainPEM, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	cert := &queue.Certificate{
		ChainPEM:   chainPEM.String(),
		PrivateKey: sealed,
		NotBefore:  leaf.NotBefore,
		NotAfter:   leaf.NotAfter,
		Issuer:     leaf.Issuer.String(),
		Serial:     leaf.SerialNumber.Text(16),
		RenewAt:    at,
	}
	log.Debug("certificate obtained",
		zap.String("serial", cert.Serial), zap.Time("not_after", cert.NotAfter),
		zap.Time("renew_at", cert.RenewAt), zap.String("renew_at_source", source))
	return cert, nil
}

// newClient is a lego client for one order (or one registration): lego fetches the
// directory here, and wraps hc's transport, so clients are not shared.
func (i *Issuer) newClient(acct *account, hc *http.Client) (*lego.Client, error) {
	cfg := lego.NewConfig(acct)
	cfg.CADirURL = i.cfg.DirectoryURL
	cfg.UserAgent = userAgent
	cfg.HTTPClient = hc
	cfg.Certificate.KeyType = i.keyType
	// How long lego waits for the CA to issue after finalize.
	cfg.Certificate.Timeout = max(30*time.Second, i.cfg.httpTimeout())
	return lego.NewClient(cfg)
}

// fail classifies an order's error; a cancelled order says so, whatever lego made of
// its failing requests.
func (i *Issuer) fail(ctx context.Context, err error, tr *orderTransport) error {
	if ctx.Err() != nil {
		return fmt.Errorf("acme: order abandoned: %w", context.Cause(ctx))
	}
	return classify(err, tr)
}

// retryWithoutReplaces reports whether an order that named the certificate it
// replaces failed in a way that ordering without may fix: the CA answered a problem
// (not a rate limit, not a lost account) before any challenge was attempted.
func retryWithoutReplaces(ctx context.Context, err error, tokens *tokenStore) bool {
	if ctx.Err() != nil || tokens.presented.Load() {
		return false
	}
	var e *Error
	if !errors.As(classify(err, nil), &e) {
		return false
	}
	return e.Type != problemAccountDoesNotExist
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
