package acme_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/acme"
)

func testKeyPEM(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

func testKEK(fill byte) []byte {
	k := make([]byte, acme.KeyEncryptionKeySize)
	for i := range k {
		k[i] = fill + byte(i)
	}
	return k
}

// The sealed format is what the proxy decrypts: it must round-trip, refuse a wrong
// key or a key moved to another row, and leave PEM alone. Guards against a format
// change that locks the proxy out of every key, and against a sealed key that
// silently opens for the wrong domain.
func TestSeal_RoundTripAndRefusals(t *testing.T) {
	t.Parallel()
	keyPEM := testKeyPEM(t)
	kek := testKEK(1)

	sealed, err := acme.Seal(kek, keyPEM, "a.example")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(sealed, "certworker:aes256gcm:v1:"))
	require.True(t, acme.IsSealed(sealed))
	require.NotContains(t, sealed, "PRIVATE KEY")
	require.NotContains(t, sealed, "\n", "one line of text")
	raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(sealed, acme.SealedPrefix))
	require.NoError(t, err, "standard base64 with padding")
	require.Len(t, raw, 12+len(keyPEM)+16, "nonce || ciphertext || tag")

	again, err := acme.Seal(kek, keyPEM, "a.example")
	require.NoError(t, err)
	require.NotEqual(t, sealed, again, "a fresh nonce every time")

	opened, err := acme.Open(kek, sealed, "a.example")
	require.NoError(t, err)
	require.Equal(t, keyPEM, opened)

	_, err = acme.Open(testKEK(2), sealed, "a.example")
	require.ErrorIs(t, err, acme.ErrUnseal, "wrong key encryption key")
	_, err = acme.Open(kek, sealed, "b.example")
	require.ErrorIs(t, err, acme.ErrUnseal, "wrong AAD: the key was moved to another row")
	_, err = acme.Open(nil, sealed, "a.example")
	require.ErrorIs(t, err, acme.ErrNoKeyEncryptionKey)

	tampered := []byte(sealed)
	tampered[len(tampered)-5] ^= 0x01
	_, err = acme.Open(kek, string(tampered), "a.example")
	require.Error(t, err, "an altered sealed key must not open")

	_, err = acme.Open(kek, strings.Replace(sealed, ":v1:", ":v2:", 1), "a.example")
	require.ErrorContains(t, err, "unknown version")
	_, err = acme.Open(kek, "garbage", "a.example")
	require.ErrorIs(t, err, acme.ErrKeyFormat)
	_, err = acme.Seal(make([]byte, 16), keyPEM, "a.example")
	require.ErrorContains(t, err, "--key-encryption-key")
}

// Without a key encryption key keys are stored as PEM, and a PEM row (uploaded by
// hand, or stored before the key was set) is read as it is even with one. Guards
// against every hand-uploaded certificate breaking the day encryption is turned on.
func TestSeal_PlaintextPassesThrough(t *testing.T) {
	t.Parallel()
	keyPEM := testKeyPEM(t)
	stored, err := acme.Seal(nil, keyPEM, "a.example")
	require.NoError(t, err)
	require.Equal(t, string(keyPEM), stored)
	require.False(t, acme.IsSealed(stored))

	for _, kek := range [][]byte{nil, testKEK(1)} {
		opened, err := acme.Open(kek, string(keyPEM), "any.example")
		require.NoError(t, err)
		require.Equal(t, keyPEM, opened)
	}
}

// --key-encryption-key is base64 of 32 bytes; a bad value is refused with the flag's
// name and without echoing the value. Guards against a short key accepted (AES-128
// by accident) and a secret printed in an error.
func TestParseKeyEncryptionKey(t *testing.T) {
	t.Parallel()
	good := testKEK(7)
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		got, err := acme.ParseKeyEncryptionKey(enc.EncodeToString(good))
		require.NoError(t, err)
		require.Equal(t, good, got)
	}
	got, err := acme.ParseKeyEncryptionKey("")
	require.NoError(t, err)
	require.Nil(t, got)

	short := base64.StdEncoding.EncodeToString([]byte("sixteen byte key"))
	_, err = acme.ParseKeyEncryptionKey(short)
	require.ErrorContains(t, err, "--key-encryption-key")
	require.NotContains(t, err.Error(), short)
	_, err = acme.ParseKeyEncryptionKey("not base64 at all: supersecret")
	require.ErrorContains(t, err, "--key-encryption-key")
	require.NotContains(t, err.Error(), "supersecret")
}
