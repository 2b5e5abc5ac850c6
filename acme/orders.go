package acme

import (
	"context"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/certworker/certworker/queue/issuing"
)

// replacesRetry is how long a name waits after the CA refused to see its certificate
// replaced again, before the renewal is ordered again naming it: the replacement
// order the CA holds may expire or fail meanwhile, and then the exemption is back.
const replacesRetry = time.Hour

// orderRecord is a domain's row of certworker_orders at this issuer's CA: the order
// in flight, so that whoever takes the domain next goes on with it.
type orderRecord struct {
	URL      string
	Replaces string
	// KeyPEM is the certificate key the finalize was to be sent with, sealed as
	// every stored key ("" until the finalize is near).
	KeyPEM string
	// ReplacesRefused is the certificate id the CA refused to see replaced again
	// while no order of ours could be resumed.
	ReplacesRefused string
}

// orderBook records a domain's order under its claim. Without a domain id (an
// issuer used outside the worker) it records nothing and finds nothing.
type orderBook struct {
	pool      *pgxpool.Pool
	log       *zap.Logger
	directory string
	domainID  string
	claim     string
}

func (b *orderBook) off() bool {
	if b == nil {
		return true
	}
	_, err := uuid.Parse(b.domainID)
	return err != nil
}

// load returns the domain's record at this CA, or nil.
func (b *orderBook) load(ctx context.Context) (*orderRecord, error) {
	if b.off() {
		return nil, nil
	}
	rctx, cancel := context.WithTimeout(ctx, tokenWriteTimeout)
	defer cancel()
	var url, replaces, key, refused *string
	err := b.pool.QueryRow(rctx, `
SELECT order_url, replaces, key_pem, replaces_refused FROM certworker_orders
WHERE domain_id = $1::uuid AND directory = $2`, b.domainID, b.directory).Scan(&url, &replaces, &key, &refused)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		err = fmt.Errorf("read the domain's recorded order: %w", err)
		if ctx.Err() == nil && !issuing.DatabaseAnswered(err) {
			// Read before anything is sent to the CA: nothing ordered, not charged.
			// The order's context is live; the read's own bound may have passed.
			return nil, &issuing.DatabaseUnavailableError{Err: err}
		}
		return nil, err
	}
	return &orderRecord{URL: deref(url), Replaces: deref(replaces), KeyPEM: deref(key), ReplacesRefused: deref(refused)}, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// recordOrderSQL records the order ($3 URL, $4 replaces) of domain $1 at CA $2 under
// claim $5 (presentSQL's fence), forgetting any key of an earlier order.
func recordOrderSQL(fenced bool) string {
	return `
WITH held AS (
    ` + heldSQL(fenced, 5) + `
)
INSERT INTO certworker_orders (domain_id, directory, order_url, replaces, key_pem, claim_token, recorded_at)
SELECT $1::uuid, $2, $3, NULLIF($4, ''), NULL, held.claim, now() FROM held
ON CONFLICT (domain_id) DO UPDATE
    SET directory = EXCLUDED.directory, order_url = EXCLUDED.order_url, replaces = EXCLUDED.replaces,
        key_pem = NULL, claim_token = EXCLUDED.claim_token, recorded_at = now(),
        replaces_refused = CASE WHEN certworker_orders.directory = EXCLUDED.directory
                                THEN certworker_orders.replaces_refused END
RETURNING 1`
}

// recordKeySQL records the sealed key ($4) of the order $3 of domain $1 at CA $2,
// under claim $5, and in the same statement the domain's validated event: the key is
// recorded once the CA has validated every name of the order, before the finalize.
func recordKeySQL(fenced bool) string {
	return `
WITH held AS (
    ` + heldSQL(fenced, 5) + `
)
UPDATE certworker_orders o SET key_pem = $4, claim_token = held.claim, recorded_at = now()
FROM held
WHERE o.domain_id = $1::uuid AND o.directory = $2 AND o.order_url = $3
RETURNING (SELECT certworker_domain_event(d.id, d.tenant_id, 'validated', NULL, NULL, now())
           FROM proxy_domains d WHERE d.id = o.domain_id)`
}

// recordRefusalSQL records that CA $2 refused to see certificate $3 replaced again,
// for domain $1, under claim $4.
func recordRefusalSQL(fenced bool) string {
	return `
WITH held AS (
    ` + heldSQL(fenced, 4) + `
)
INSERT INTO certworker_orders (domain_id, directory, replaces_refused, claim_token, recorded_at)
SELECT $1::uuid, $2, $3, held.claim, now() FROM held
ON CONFLICT (domain_id) DO UPDATE
    SET directory = EXCLUDED.directory, replaces_refused = EXCLUDED.replaces_refused,
        order_url = NULL, replaces = NULL, key_pem = NULL,
        claim_token = EXCLUDED.claim_token, recorded_at = now()
RETURNING 1`
}

// recordOrder records the order's URL, right after the CA accepted it. An error
// (wrapping issuing.ErrLeaseDeadline when the claim is no longer held) stops the
// order: an order nobody could find again must not go on to a certificate.
func (b *orderBook) recordOrder(ctx context.Context, url, replaces string) error {
	return b.write(ctx, recordOrderSQL, "record the order", url, replaces)
}

// recordKey records the sealed certificate key before the finalize.
func (b *orderBook) recordKey(ctx context.Context, url, sealed string) error {
	return b.write(ctx, recordKeySQL, "record the certificate key", url, sealed)
}

// write runs a fenced write of the domain's record at this CA, with args after the
// domain id and the directory.
func (b *orderBook) write(ctx context.Context, sql func(fenced bool) string, what string, args ...any) error {
	if b.off() {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, tokenWriteTimeout)
	defer cancel()
	return writeFenced(ctx, b.pool, sql(b.claim != ""), b.claim, append([]any{b.domainID, b.directory}, args...), what)
}

// recordRefusal records that the CA refused to see certificate id replaced again; a
// failure is logged (the name is paused all the same, and asks again).
func (b *orderBook) recordRefusal(ctx context.Context, id string) {
	if b.off() {
		return
	}
	if err := b.write(context.WithoutCancel(ctx), recordRefusalSQL, "record the CA's refusal", id); err != nil {
		b.log.Info("could not record that the CA refused the replacement", zap.Error(err))
	}
}

// forget deletes the record of order url, which the CA says is over; a failure is
// logged (the next order finds it over again).
func (b *orderBook) forget(ctx context.Context, url string) {
	if b.off() {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tokenWriteTimeout)
	defer cancel()
	if _, err := b.pool.Exec(ctx, `
DELETE FROM certworker_orders WHERE domain_id = $1::uuid AND directory = $2 AND order_url = $3`,
		b.domainID, b.directory, url); err != nil {
		b.log.Info("could not forget the order the CA ended", zap.Error(err))
	}
}

// sealKey is key as stored: PKCS #8 PEM, sealed for domain when keys are sealed.
func (i *Issuer) sealKey(key crypto.PrivateKey, domain string) (string, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", fmt.Errorf("acme: encode certificate key: %w", err)
	}
	sealed, err := i.cfg.KeyEncryptionKeys.Seal(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), domain)
	if err != nil {
		return "", fmt.Errorf("acme: %w", err)
	}
	return sealed, nil
}

// openKey opens a key sealKey stored.
func (i *Issuer) openKey(stored, domain string) (crypto.PrivateKey, error) {
	raw, err := i.cfg.KeyEncryptionKeys.Open(stored, domain)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(raw)
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	return x509.ParsePKCS8PrivateKey(block.Bytes)
}

// thirdLeftAt is when a third of the lifetime of the leaf of chainPEM is left, or
// zero when it cannot be read.
func thirdLeftAt(chainPEM string) time.Time {
	chain, err := parseChain([]byte(chainPEM))
	if err != nil {
		return time.Time{}
	}
	leaf := chain[0]
	return leaf.NotAfter.Add(-leaf.NotAfter.Sub(leaf.NotBefore) / 3)
}
