package seal_test

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/certstore/seal"
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
	k := make([]byte, seal.KeySize)
	for i := range k {
		k[i] = fill + byte(i)
	}
	return k
}

// sealV1 writes the v1 format as the worker did before key rotation: nothing in this
// build writes it any more, but stored keys keep it until `certworker rekey` runs.
func sealV1(t *testing.T, kek, plaintext []byte, aad string) string {
	t.Helper()
	block, err := aes.NewCipher(kek)
	require.NoError(t, err)
	gcm, err := cipher.NewGCM(block)
	require.NoError(t, err)
	nonce := make([]byte, 12)
	_, err = rand.Read(nonce)
	require.NoError(t, err)
	return seal.PrefixV1 + base64.StdEncoding.EncodeToString(gcm.Seal(nonce, nonce, plaintext, []byte(aad)))
}

// openAsDocumented reads a v2 key the way docs/security.md tells a proxy in another language
// to, with nothing from this package: a guard against the code and the written
// format drifting apart, which would lock every other reader out of every key.
func openAsDocumented(t *testing.T, keks [][]byte, stored, aad string) []byte {
	t.Helper()
	rest, ok := strings.CutPrefix(stored, "certworker:aes256gcm:v2:")
	require.True(t, ok, "v2 prefix")
	id, payload, ok := strings.Cut(rest, ":")
	require.True(t, ok, "key id, then a colon")
	raw, err := base64.StdEncoding.DecodeString(payload)
	require.NoError(t, err, "standard base64 with padding")
	for _, kek := range keks {
		sum := sha256.Sum256(kek)
		if hex.EncodeToString(sum[:4]) != id {
			continue
		}
		block, err := aes.NewCipher(kek)
		require.NoError(t, err)
		gcm, err := cipher.NewGCM(block)
		require.NoError(t, err)
		plain, err := gcm.Open(nil, raw[:12], raw[12:], []byte(aad))
		require.NoError(t, err)
		return plain
	}
	t.Fatalf("no key has id %s", id)
	return nil
}

// keyFormatPage is where a proxy in another language reads the stored key format.
const keyFormatPage = "../../docs/security.md"

// The page a proxy's author reads gives the format openAsDocumented follows: the two
// prefixes, v2's key id before the payload, and how a reader tells them apart. Guards
// against the page and the code drifting apart, which would send every other reader
// the wrong way.
func TestSeal_FormatIsTheDocumentedOne(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile(keyFormatPage)
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(page), "\n## Private keys at rest\n")
	require.True(t, ok, "%s has no section \"Private keys at rest\"", keyFormatPage)
	section, _, _ = strings.Cut(section, "\n## ")
	section = strings.Join(strings.Fields(section), " ") // line breaks are the page's
	for _, want := range []string{
		seal.PrefixV2 + "<key id>:<base64(nonce || ciphertext || tag)>",
		seal.PrefixV1 + "<base64(nonce || ciphertext || tag)>",
		"If it starts with `" + seal.PrefixV2 + "`, split the rest at the first `:` into the key id and the base64",
		"If it starts with `" + seal.PrefixV1 + "`, do the same with the whole rest as the base64",
		"The key id is the first 4 bytes of SHA-256 of the 32-byte key, as 8 lower-case hex digits",
		"take the first 12 bytes as the nonce",
	} {
		require.True(t, strings.Contains(section, want), "%s, \"Private keys at rest\", does not say %q", keyFormatPage, want)
	}
}

// The sealed format is what the proxy decrypts: it must round-trip, follow
// docs/security.md, name its key, refuse a wrong key or a key moved to another row, and leave
// PEM alone. Guards against a format change that locks the proxy out of every key,
// and against a sealed key that silently opens for the wrong domain.
func TestSeal_V2RoundTripAndRefusals(t *testing.T) {
	t.Parallel()
	keyPEM := testKeyPEM(t)
	ring := seal.Keyring{testKEK(1)}

	sealed, err := ring.Seal(keyPEM, "a.example")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(sealed, seal.PrefixV2+seal.KeyID(testKEK(1))+":"), sealed)
	require.Len(t, seal.KeyID(testKEK(1)), 8, "4 bytes in hex")
	require.True(t, seal.IsSealed(sealed))
	require.True(t, ring.Current(sealed))
	require.NotContains(t, sealed, "PRIVATE KEY")
	require.NotContains(t, sealed, "\n", "one line of text")
	require.Equal(t, keyPEM, openAsDocumented(t, ring, sealed, "a.example"))
	raw, err := base64.StdEncoding.DecodeString(sealed[strings.LastIndex(sealed, ":")+1:])
	require.NoError(t, err)
	require.Len(t, raw, 12+len(keyPEM)+16, "nonce || ciphertext || tag")

	again, err := ring.Seal(keyPEM, "a.example")
	require.NoError(t, err)
	require.NotEqual(t, sealed, again, "a fresh nonce every time")

	opened, err := ring.Open(sealed, "a.example")
	require.NoError(t, err)
	require.Equal(t, keyPEM, opened)

	_, err = seal.Keyring{testKEK(2)}.Open(sealed, "a.example")
	require.ErrorIs(t, err, seal.ErrUnknownKey, "a key the ring does not hold")
	require.ErrorContains(t, err, seal.KeyID(testKEK(1)), "the error names the missing key's id")
	_, err = ring.Open(sealed, "b.example")
	require.ErrorIs(t, err, seal.ErrUnseal, "wrong AAD: the key was moved to another row")
	_, err = seal.Keyring(nil).Open(sealed, "a.example")
	require.ErrorIs(t, err, seal.ErrNoKey)

	// One bit of the tag flipped, re-encoded (flipping a bit of the text could make
	// it bad base64 instead, a different refusal).
	raw[len(raw)-1] ^= 0x01
	tampered := sealed[:strings.LastIndex(sealed, ":")+1] + base64.StdEncoding.EncodeToString(raw)
	_, err = ring.Open(tampered, "a.example")
	require.ErrorIs(t, err, seal.ErrUnseal, "an altered sealed key must not open")

	_, err = ring.Open(strings.Replace(sealed, ":v2:", ":v3:", 1), "a.example")
	require.ErrorContains(t, err, "unknown version")
	_, err = ring.Open("garbage", "a.example")
	require.ErrorIs(t, err, seal.ErrFormat)
	_, err = seal.Keyring{make([]byte, 16)}.Seal(keyPEM, "a.example")
	require.ErrorContains(t, err, "--key-encryption-key")
}

// Rotation: the first key seals, every key opens, and v1 keys (which name no key)
// open under any key of the ring. Guards against a rotation that strands the keys
// sealed before it.
func TestSeal_RotationOpensOldKeysAndSealsWithTheFirst(t *testing.T) {
	t.Parallel()
	keyPEM := testKeyPEM(t)
	oldKey, newKey := testKEK(1), testKEK(2)

	underOld, err := seal.Keyring{oldKey}.Seal(keyPEM, "a.example")
	require.NoError(t, err)
	v1 := sealV1(t, oldKey, keyPEM, "a.example")

	rotated := seal.Keyring{newKey, oldKey}
	for name, stored := range map[string]string{"v2 under the old key": underOld, "v1": v1} {
		opened, err := rotated.Open(stored, "a.example")
		require.NoError(t, err, name)
		require.Equal(t, keyPEM, opened, name)
		require.False(t, rotated.Current(stored), "%s must be re-sealed by rekey", name)
		_, err = rotated.Open(stored, "b.example")
		require.ErrorIs(t, err, seal.ErrUnseal, name)
	}
	_, err = seal.Keyring{newKey}.Open(v1, "a.example")
	require.ErrorIs(t, err, seal.ErrUnseal, "v1 under a key the ring lacks")

	resealed, err := rotated.Seal(keyPEM, "a.example")
	require.NoError(t, err)
	require.True(t, rotated.Current(resealed))
	require.Equal(t, seal.KeyID(newKey), rotated.SealingKeyID())
	require.Contains(t, resealed, ":"+seal.KeyID(newKey)+":", "sealed with the first key")
	_, err = seal.Keyring{oldKey}.Open(resealed, "a.example")
	require.ErrorIs(t, err, seal.ErrUnknownKey, "a reader that lacks the new key cannot open it: readers come first")
}

// Without keys, keys are stored as PEM, and a PEM row (uploaded by hand, or stored
// before keys were set) is read as it is even with keys. Guards against every
// hand-uploaded certificate breaking the day encryption is turned on.
func TestSeal_PlaintextPassesThrough(t *testing.T) {
	t.Parallel()
	keyPEM := testKeyPEM(t)
	stored, err := seal.Keyring(nil).Seal(keyPEM, "a.example")
	require.NoError(t, err)
	require.Equal(t, string(keyPEM), stored)
	require.False(t, seal.IsSealed(stored))
	require.True(t, seal.Keyring(nil).Current(stored))
	require.False(t, seal.Keyring{testKEK(1)}.Current(stored), "rekey seals a PEM key")

	for _, ring := range []seal.Keyring{nil, {testKEK(1)}} {
		opened, err := ring.Open(string(keyPEM), "any.example")
		require.NoError(t, err)
		require.Equal(t, keyPEM, opened)
	}
}

// --key-encryption-key is a comma-separated list of base64 of 32 bytes; a bad value
// is refused with the flag's name and the key's place, never echoing the value.
// Guards against a short key accepted (AES-128 by accident) and a secret printed in
// an error.
func TestParseKeyring(t *testing.T) {
	t.Parallel()
	a, b := testKEK(7), testKEK(9)
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		got, err := seal.ParseKeyring(enc.EncodeToString(a))
		require.NoError(t, err)
		require.Equal(t, seal.Keyring{a}, got)
	}
	got, err := seal.ParseKeyring(" " + base64.StdEncoding.EncodeToString(a) + " , " + base64.RawURLEncoding.EncodeToString(b))
	require.NoError(t, err)
	require.Equal(t, seal.Keyring{a, b}, got, "in order: the first seals")

	got, err = seal.ParseKeyring("  ")
	require.NoError(t, err)
	require.Nil(t, got)

	short := base64.StdEncoding.EncodeToString([]byte("sixteen byte key"))
	for _, tc := range []struct{ value, want string }{
		{short, "key 1 of 1"},
		{base64.StdEncoding.EncodeToString(a) + "," + short, "key 2 of 2"},
		{base64.StdEncoding.EncodeToString(a) + ",", "key 2 of 2"},
		{"not base64 at all: supersecret", "not base64"},
	} {
		_, err := seal.ParseKeyring(tc.value)
		require.ErrorContains(t, err, "--key-encryption-key", tc.value)
		require.ErrorContains(t, err, tc.want, tc.value)
		require.NotContains(t, err.Error(), short)
		require.NotContains(t, err.Error(), "supersecret")
	}
	require.NoError(t, seal.Keyring{a, a}.Validate(), "the same key twice is harmless")
	require.ErrorContains(t, seal.Keyring{a, make([]byte, 31)}.Validate(), "key 2 of 2 must be 32 bytes")
}

// --key-encryption-key-file holds the flag's list; the newline an editor or a secret
// store leaves, and spaces and line breaks around the keys, are ignored. A file that
// cannot be read, holds no key, holds two keys on two lines with no comma, or is
// not a list at all is refused, naming the flag and the path but never a key.
// Guards against an empty or missing secret starting a worker that stores keys in
// the clear, and against a key printed in an error.
func TestReadKeyringFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
		return path
	}
	a, b := base64.StdEncoding.EncodeToString(testKEK(3)), base64.RawURLEncoding.EncodeToString(testKEK(5))
	got, err := seal.ReadKeyringFile(write("two", "  "+a+" ,\n\t"+b+"\r\n\n"))
	require.NoError(t, err)
	require.Equal(t, seal.Keyring{testKEK(3), testKEK(5)}, got, "in order: the first seals")

	short := base64.StdEncoding.EncodeToString([]byte("sixteen byte key"))
	for _, tc := range []struct{ name, content, want string }{
		{"empty", "", "holds no key"},
		{"blank", " \n\n", "holds no key"},
		{"short", short + "\n", "key 1 of 1: must be base64 of 32 bytes"},
		{"lines", a + "\n" + b + "\n", "key 1 of 1: holds a line break: separate keys with commas"},
		{"trailing comma", a + ",\n", "key 2 of 2: empty"},
		{"garbage", "supersecret!\n", "not base64"},
		{"large", strings.Repeat(a+",", 2000), "larger than 64 KiB"},
	} {
		path := write(tc.name, tc.content)
		_, err := seal.ReadKeyringFile(path)
		require.ErrorContains(t, err, "--key-encryption-key-file "+path+": ", tc.name)
		require.ErrorContains(t, err, tc.want, tc.name)
		for _, secret := range []string{a, b, short, "supersecret"} {
			require.NotContains(t, err.Error(), secret, tc.name)
		}
	}
	_, err = seal.ReadKeyringFile(filepath.Join(dir, "missing"))
	require.ErrorContains(t, err, "--key-encryption-key-file: open "+filepath.Join(dir, "missing")+": no such file or directory")
	_, err = seal.ReadKeyringFile(dir)
	require.ErrorContains(t, err, "--key-encryption-key-file", "a directory")
	require.False(t, bytes.Contains([]byte(err.Error()), []byte(a)))
}
