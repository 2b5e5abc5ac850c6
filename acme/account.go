package acme

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"strings"

	legoacme "github.com/go-acme/lego/v4/acme"
	"github.com/go-acme/lego/v4/certcrypto"
	"github.com/go-acme/lego/v4/registration"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/certworker/certworker/certstore/seal"
	"github.com/certworker/certworker/queue/issuing"
)

// account is the ACME account orders are placed with; it is lego's registration.User.
type account struct {
	email string
	key   crypto.PrivateKey
	reg   *registration.Resource
}

func (a *account) GetEmail() string                        { return a.email }
func (a *account) GetRegistration() *registration.Resource { return a.reg }
func (a *account) GetPrivateKey() crypto.PrivateKey        { return a.key }

// accountFor returns the account for this issuer's directory and EAB key id: from
// memory, else from PostgreSQL, else registered now. Called with every order, so
// that a CA that is down when the worker starts only fails the orders, and the first
// order after it comes back registers.
//
// A stored row with an empty uri holds a key reserved for the account but not yet
// registered with the CA (registerAccount): the account is registered with that key.
func (i *Issuer) accountFor(ctx context.Context, tr *orderTransport) (*account, error) {
	i.accountMu.Lock()
	defer i.accountMu.Unlock()
	if i.account != nil {
		return i.account, nil
	}
	acct, err := i.loadAccount(ctx, i.pool)
	if err != nil {
		return nil, err
	}
	if acct == nil {
		if acct, err = i.reserveAccountKey(ctx); err != nil {
			return nil, err
		}
	}
	if acct.reg == nil || acct.reg.URI == "" {
		if acct, err = i.registerAccount(ctx, tr, acct); err != nil {
			return nil, err
		}
	}
	if acct.email != i.cfg.Email {
		i.log.Info("ACME account contact differs from --acme-email; the account keeps the one it was registered with",
			zap.String("directory", i.cfg.DirectoryURL), zap.String("account_uri", acct.reg.URI))
	}
	i.account = acct
	return acct, nil
}

// CheckAccountKey opens the stored account key of this issuer's directory and EAB
// key id with the configured keys, and keeps nothing: `run` calls it before it claims
// anything, and /readyz on every probe. No account stored yet is
// fine: the first order registers one. A stored key that does not open is a
// *issuing.KeyError naming the key id it lacks; any other error is the database's.
func (i *Issuer) CheckAccountKey(ctx context.Context) error {
	return i.CheckAccountKeyOn(ctx, i.pool)
}

// CheckAccountKeyOn is CheckAccountKey on q: a session the caller holds already, as
// /readyz does for all its checks, so that a check asks everything on one session.
func (i *Issuer) CheckAccountKeyOn(ctx context.Context, q Queryer) error {
	_, err := i.loadAccount(ctx, q)
	return err
}

// Queryer is what reading the stored account needs: a pool, a connection taken from
// one, or a transaction.
type Queryer interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// loadAccount reads the stored account, or returns nil when there is none.
func (i *Issuer) loadAccount(ctx context.Context, q Queryer) (*account, error) {
	var email, stored, uri string
	var regJSON []byte
	err := q.QueryRow(ctx, `
SELECT email, private_key_pem, uri, registration FROM certworker_acme_accounts
WHERE directory = $1 AND eab_kid = $2`, i.cfg.DirectoryURL, i.cfg.EABKeyID).Scan(&email, &stored, &uri, &regJSON)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load ACME account: %w", err)
	}
	keyPEM, err := i.cfg.KeyEncryptionKeys.Open(stored, i.cfg.DirectoryURL)
	if err != nil {
		return nil, i.keyError(stored, err)
	}
	key, err := certcrypto.ParsePEMPrivateKey(keyPEM)
	if err != nil {
		// The parser's message never quotes the key.
		return nil, i.keyError(stored, fmt.Errorf("not a private key once opened: %w", err))
	}
	reg := &registration.Resource{}
	if len(regJSON) > 0 {
		if err := json.Unmarshal(regJSON, reg); err != nil {
			return nil, fmt.Errorf("load ACME account registration: %w", err)
		}
	}
	// uri is the column the account is known by; the JSON is informative.
	reg.URI = uri
	return &account{email: email, key: key, reg: reg}, nil
}

// keyError is the *issuing.KeyError for a stored account key that err says cannot be
// used with the configured keys: it names the key id the key is sealed under where the
// format names one (v2), and otherwise the ids of the keys that were tried, so that
// the operator can tell which key is missing.
func (i *Issuer) keyError(stored string, err error) *issuing.KeyError {
	what := "ACME account key of " + i.cfg.DirectoryURL
	if i.cfg.EABKeyID != "" {
		what += " (EAB key id " + i.cfg.EABKeyID + ")"
	}
	id := seal.SealedKeyID(stored)
	switch {
	case errors.Is(err, seal.ErrUnknownKey):
		// The message names the id already.
	case id != "":
		err = fmt.Errorf("%w (it names key id %s)", err, id)
	case errors.Is(err, seal.ErrUnseal):
		err = fmt.Errorf("%w (it is sealed in the v1 format, which names no key id; tried key ids %s)",
			err, strings.Join(i.cfg.KeyEncryptionKeys.IDs(), ", "))
	}
	return &issuing.KeyError{Key: what, KeyID: id, Err: err}
}

// reserveAccountKey makes the account's key and stores it, unregistered (an empty uri),
// unless another instance has stored one first; it returns the stored one, whichever
// it is. One statement, no lock: the primary key decides, and every instance then
// registers with the same key (registerAccount).
func (i *Issuer) reserveAccountKey(ctx context.Context) (*account, error) {
	// The account key is always P-256 (ES256), which every ACME CA accepts; the
	// certificates' key type is --key-type.
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("register ACME account: generate key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("register ACME account: encode key: %w", err)
	}
	stored, err := i.cfg.KeyEncryptionKeys.Seal(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), i.cfg.DirectoryURL)
	if err != nil {
		return nil, fmt.Errorf("register ACME account: seal key: %w", err)
	}
	if _, err := i.pool.Exec(ctx, `
INSERT INTO certworker_acme_accounts (directory, eab_kid, email, private_key_pem, uri)
VALUES ($1, $2, $3, $4, '')
ON CONFLICT (directory, eab_kid) DO NOTHING`,
		i.cfg.DirectoryURL, i.cfg.EABKeyID, i.cfg.Email, stored); err != nil {
		return nil, fmt.Errorf("store ACME account key: %w", err)
	}
	acct, err := i.loadAccount(ctx, i.pool)
	if err == nil && acct == nil {
		// Deleted between the two statements (forgetAccount of a CA reset): the
		// next order starts over.
		err = errors.New("register ACME account: the stored account disappeared; the next order registers again")
	}
	return acct, err
}

// registerAccount registers acct's key with the CA and records the account URL the
// CA returns. No transaction and no lock is held across the call to the CA: an
// instance cut off from the database mid-call would otherwise keep every other
// instance waiting for as long as the server kept its session.
//
// One account per directory and EAB key id, still: every instance registers with
// the one key stored for it (reserveAccountKey), and a CA answers a registration of
// a key it already knows with that key's account (RFC 8555 §7.3.1), so two instances
// starting together find the same account, and a registration whose answer was lost
// is found again by the next one instead of leaving an orphan. What remains: a CA
// that breaks that rule, and an account forgotten (forgetAccount) while another
// instance registers the old key, which leaves that instance ordering with the old
// account until its next restart.
func (i *Issuer) registerAccount(ctx context.Context, tr *orderTransport, acct *account) (*account, error) {
	core, err := i.newCore(acct, tr)
	if err != nil {
		return nil, err
	}
	registrar := registration.NewRegistrar(core, acct)
	var reg *registration.Resource
	if i.cfg.EABKeyID != "" {
		reg, err = registrar.RegisterWithExternalAccountBinding(registration.RegisterEABOptions{
			TermsOfServiceAgreed: true,
			Kid:                  i.cfg.EABKeyID,
			HmacEncoded:          i.cfg.EABHMAC,
		})
	} else {
		reg, err = registrar.Register(registration.RegisterOptions{TermsOfServiceAgreed: true})
	}
	if err != nil {
		i.dropRefusedKey(ctx, err)
		if refused := i.eabRefused(err); refused != nil {
			return nil, refused
		}
		return nil, err
	}
	if reg == nil || reg.URI == "" {
		return nil, errors.New("acme: the CA registered the account but returned no account URL")
	}
	regJSON, err := json.Marshal(reg)
	if err != nil {
		return nil, fmt.Errorf("register ACME account: %w", err)
	}
	// Only a row still unregistered: another instance that registered the same key
	// first stored the same URL.
	tag, err := i.pool.Exec(ctx, `
UPDATE certworker_acme_accounts SET uri = $3, registration = $4
WHERE directory = $1 AND eab_kid = $2 AND uri = ''`,
		i.cfg.DirectoryURL, i.cfg.EABKeyID, reg.URI, regJSON)
	if err != nil {
		return nil, fmt.Errorf("store ACME account: %w", err)
	}
	acct.reg = reg
	if tag.RowsAffected() > 0 {
		i.log.Info("ACME account registered",
			zap.String("directory", i.cfg.DirectoryURL), zap.String("account_uri", reg.URI))
	}
	return acct, nil
}

// dropRefusedKey deletes the stored, unregistered key when the CA refused its
// registration outright (a problem document with a 4xx status, but a rate limit): the
// CA created no account for it, and a key kept would outlive the configuration that
// was refused (an EAB key id added since, say) as a row nothing registers. A
// registration that failed any other way (no answer, 5xx) may have created the
// account: the key stays, and the next registration finds the account again.
func (i *Issuer) dropRefusedKey(ctx context.Context, err error) {
	var pd *legoacme.ProblemDetails
	if !errors.As(err, &pd) || pd == nil || pd.HTTPStatus < 400 || pd.HTTPStatus >= 500 ||
		pd.HTTPStatus == http.StatusTooManyRequests || pd.Type == problemRateLimited {
		return
	}
	if _, derr := i.pool.Exec(ctx, `
DELETE FROM certworker_acme_accounts WHERE directory = $1 AND eab_kid = $2 AND uri = ''`,
		i.cfg.DirectoryURL, i.cfg.EABKeyID); derr != nil {
		i.log.Debug("could not delete the ACME account key the CA refused to register", zap.Error(derr))
	}
}

// forgetAccount drops an account the CA no longer knows (accountDoesNotExist: the CA
// was reset, or the account deactivated), so that the next order registers afresh.
// Only the row with that URL: another instance may have replaced it already.
func (i *Issuer) forgetAccount(ctx context.Context, acct *account) {
	i.accountMu.Lock()
	if i.account == acct {
		i.account = nil
	}
	i.accountMu.Unlock()
	if acct.reg == nil {
		return
	}
	if _, err := i.pool.Exec(ctx, `
DELETE FROM certworker_acme_accounts WHERE directory = $1 AND eab_kid = $2 AND uri = $3`,
		i.cfg.DirectoryURL, i.cfg.EABKeyID, acct.reg.URI); err != nil {
		i.log.Warn("could not delete the ACME account the CA does not know", zap.Error(err))
		return
	}
	i.log.Warn("the CA does not know the stored ACME account; the next order registers a new one",
		zap.String("directory", i.cfg.DirectoryURL), zap.String("account_uri", acct.reg.URI))
}

// problemExternalAccountRequired is a CA's refusal of an account registered
// without an external account binding (RFC 8555 §7.3.4).
const problemExternalAccountRequired = problemNS + "externalAccountRequired"

// EABRefusedError: the CA refused to register the account with the configured
// external account binding (an unknown key id, an HMAC key that does not verify), or
// without one where it requires one. It is the operator's configuration, never a
// domain's: `run` exits 2 on it at start (RegisterAccount), and an order meeting it
// returns it inside a *issuing.CAUnavailableError (not charged, the CA paused for
// every instance) until an instance with the right key registers. Its message names
// the directory, the key id and the CA's problem, never the HMAC key.
type EABRefusedError struct {
	Directory string
	KeyID     string
	// Problem is the CA's problem type and detail.
	Problem string
}

func (e *EABRefusedError) Error() string {
	if e.KeyID == "" {
		return fmt.Sprintf("the CA at %s requires an external account binding, and none is configured (%s): set the key id and HMAC key the CA gave",
			e.Directory, e.Problem)
	}
	return fmt.Sprintf("the CA at %s refused the external account binding with key id %s (%s): check the key id and the HMAC key the CA gave",
		e.Directory, e.KeyID, e.Problem)
}

// eabRefused is the *EABRefusedError for a registration the CA refused because of
// its external account binding, or nil: with a binding configured, any refusal with
// a problem document and a 4xx status but a rate limit (Pebble and Boulder answer
// unauthorized or malformed to a binding that does not verify); without one,
// externalAccountRequired.
func (i *Issuer) eabRefused(err error) *EABRefusedError {
	var pd *legoacme.ProblemDetails
	if !errors.As(err, &pd) || pd == nil || pd.HTTPStatus < 400 || pd.HTTPStatus >= 500 ||
		pd.HTTPStatus == http.StatusTooManyRequests || pd.Type == problemRateLimited {
		return nil
	}
	if i.cfg.EABKeyID == "" && pd.Type != problemExternalAccountRequired {
		return nil
	}
	return &EABRefusedError{Directory: i.cfg.DirectoryURL, KeyID: i.cfg.EABKeyID, Problem: truncate(pd.Type + ": " + pd.Detail)}
}

// UsesEAB reports whether the issuer registers its account with an external
// account binding (--acme-eab-kid).
func (i *Issuer) UsesEAB() bool { return i.cfg.EABKeyID != "" }

// RegisterAccount loads the account, or registers it now as the first order would:
// `run` calls it at start when the CA needs an external account binding, so that a
// wrong key id or HMAC key is an error before anything is claimed rather than a CA
// paused later. The error is an *EABRefusedError when the CA refused the binding, a
// *issuing.CAUnavailableError when the CA could not be reached or answered 5xx, a
// *issuing.KeyError when the stored account key does not open; any other error as
// classified for an order. None holds the HMAC key.
func (i *Issuer) RegisterAccount(ctx context.Context) error {
	tr := i.orderTransport(ctx)
	if _, err := i.accountFor(ctx, tr); err != nil {
		var refused *EABRefusedError
		if errors.As(err, &refused) {
			return refused
		}
		return i.fail(ctx, err, tr)
	}
	return nil
}
