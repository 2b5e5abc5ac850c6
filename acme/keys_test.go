package acme_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/certstore/seal"
	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/queue/issuing"
)

// An account key sealed under a key this issuer lacks (another instance, half way
// through a rotation, registered it under the new key) is a *issuing.KeyError, from
// CheckAccountKey and from Issue alike, which names the key id it lacks where the
// stored format names one (v2; v1 names none, so the message gives the ids it
// tried); nothing is sent to the CA, and no second account is registered. Guards
// against the review's finding: every due domain charged "load ACME account key:
// not in --key-encryption-key", as if the domain were at fault, until all had failed.
// A key stored as PEM (registered without a key) still opens once keys are set.
func TestAccountKey_SealedUnderAKeyTheIssuerLacksIsAKeyError(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	oldKey, newKey := make([]byte, seal.KeySize), make([]byte, seal.KeySize)
	for i := range oldKey {
		oldKey[i], newKey[i] = byte(i), byte(100+i)
	}
	withKeys := func(keys seal.Keyring) *acme.Issuer {
		cfg := b.config()
		cfg.KeyEncryptionKeys = keys
		return newIssuer(t, b.newPool(t), nil, cfg)
	}
	ctx := testCtx(t, 2*time.Minute)
	_, err := withKeys(seal.Keyring{newKey}).Issue(ctx, issuing.Request{Domain: randomName("reg")})
	require.NoError(t, err, "the account is registered under the new key")
	orders := b.ca.OrderRequests()

	stale := withKeys(seal.Keyring{oldKey})
	for _, err := range []error{
		stale.CheckAccountKey(ctx),
		issueErr(ctx, stale, randomName("stale")),
		withKeys(nil).CheckAccountKey(ctx),
	} {
		var ke *issuing.KeyError
		require.True(t, errors.As(err, &ke), "%T: %v", err, err)
		require.Equal(t, seal.KeyID(newKey), ke.KeyID)
		require.Contains(t, err.Error(), "cannot open the stored ACME account key of "+b.ca.DirectoryURL)
		require.Contains(t, err.Error(), "--key-encryption-key")
		require.Contains(t, err.Error(), seal.KeyID(newKey))
	}
	require.Equal(t, orders, b.ca.OrderRequests(), "an order was sent without an account key")
	require.Equal(t, 1, b.ca.NewAccounts(), "a second account was registered")

	// The same key in the v1 format, which names no key id.
	keyPEM := b.accountKeyPEM(t, seal.Keyring{newKey})
	v2, err := seal.Keyring{newKey}.Seal(keyPEM, b.ca.DirectoryURL)
	require.NoError(t, err)
	b.storeAccountKey(t, seal.PrefixV1+v2[strings.LastIndex(v2, ":")+1:])
	err = stale.CheckAccountKey(ctx)
	var ke *issuing.KeyError
	require.True(t, errors.As(err, &ke), "%T: %v", err, err)
	require.Empty(t, ke.KeyID)
	require.Contains(t, err.Error(), "v1 format, which names no key id; tried key ids "+seal.KeyID(oldKey))

	// Stored as PEM, as without a key: it opens with any keys, and orders use it.
	b.storeAccountKey(t, string(keyPEM))
	require.NoError(t, stale.CheckAccountKey(ctx))
	cert, err := stale.Issue(ctx, issuing.Request{Domain: randomName("pem")})
	require.NoError(t, err)
	require.Equal(t, seal.KeyID(oldKey), seal.SealedKeyID(cert.PrivateKey), "new keys are sealed with the first key")
	require.Equal(t, 1, b.ca.NewAccounts())
	require.Equal(t, string(keyPEM), b.accountKey(t), "the account key is left as it was until rekey")
}

// issueErr is the error of an order for name.
func issueErr(ctx context.Context, iss *acme.Issuer, name string) error {
	_, err := iss.Issue(ctx, issuing.Request{Domain: name})
	return err
}

// accountKey is the stored account key.
func (b *bed) accountKey(t *testing.T) string {
	t.Helper()
	var stored string
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT private_key_pem FROM certworker_acme_accounts`).Scan(&stored))
	return stored
}

// accountKeyPEM is the stored account key, opened with keys.
func (b *bed) accountKeyPEM(t *testing.T, keys seal.Keyring) []byte {
	t.Helper()
	keyPEM, err := keys.Open(b.accountKey(t), b.ca.DirectoryURL)
	require.NoError(t, err)
	return keyPEM
}

// storeAccountKey replaces the stored account key, as another instance or rekey
// would.
func (b *bed) storeAccountKey(t *testing.T, stored string) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), `UPDATE certworker_acme_accounts SET private_key_pem = $1`, stored)
	require.NoError(t, err)
}
