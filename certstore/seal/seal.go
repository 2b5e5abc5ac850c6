package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// The prefixes of the sealed formats. Named because every reader, the proxy in
// whatever language included, matches the same strings, and they have to agree.
const (
	PrefixV1 = "certworker:aes256gcm:v1:"
	PrefixV2 = "certworker:aes256gcm:v2:"
	// family is the prefixes without their version, to recognise a sealed key of a
	// version this build does not know and say so, rather than "unknown format".
	family = "certworker:aes256gcm:"
)

const (
	// KeySize is the AES-256 key size: every key of --key-encryption-key is base64
	// of exactly this many bytes.
	KeySize = 32
	// KeyIDSize is the bytes of SHA-256 a key id keeps. Four give one chance in
	// 2^32 that two keys of a rotation share an id, and Validate refuses that case.
	KeyIDSize = 4
	// nonceSize is GCM's standard nonce. Random nonces are safe for far more keys
	// than a fleet will seal under one key (NIST SP 800-38D allows 2^32 messages per
	// key with random 96-bit nonces).
	nonceSize = 12
	tagSize   = 16
)

// flag is the command-line flag the keys come from; every error names it.
const flag = "--key-encryption-key"

// fileFlag is the flag that reads the same list from a file (ReadKeyringFile).
const fileFlag = "--key-encryption-key-file"

// maxKeyringFile bounds what ReadKeyringFile reads. A key is 44 characters of base64
// and a rotation lists two or three; 64 KiB is room for a thousand, and refuses a
// path that names a device or a large file by mistake before it is read whole.
const maxKeyringFile = 64 << 10

var (
	// ErrNoKey: a sealed key was found but no key encryption key was given.
	ErrNoKey = errors.New("the key is sealed (certworker:aes256gcm) but no " + flag + " is set")
	// ErrUnseal: none of the keys opens the sealed key: it was sealed under another
	// key, moved from another row (its AAD differs), or altered.
	ErrUnseal = errors.New("cannot open the sealed key: wrong " + flag + ", key moved from another row, or altered")
	// ErrUnknownKey: a v2 sealed key names a key id that none of the keys has.
	ErrUnknownKey = errors.New("the key is sealed under a key encryption key that is not in " + flag)
	// ErrFormat: the stored key is neither PEM nor a sealed key.
	ErrFormat = errors.New("stored key is neither PEM nor a sealed key (" + family + "v1: or v2:...)")
)

// Keyring is the key encryption keys, each KeySize bytes: the first seals, any of
// them opens. An empty Keyring stores and reads PEM only. A [][]byte converts to it
// as it is; ParseKeyring reads the flag. It is safe for concurrent use as long as it
// is not modified.
type Keyring [][]byte

// ParseKeyring reads --key-encryption-key: a comma-separated list of base64
// (standard or URL alphabet, padded or not) of KeySize bytes each; spaces around a
// key are ignored. "" is no key. Errors name the flag and the key's position, never
// its value.
func ParseKeyring(s string) (Keyring, error) {
	return parseKeyring(flag, s)
}

// ReadKeyringFile reads --key-encryption-key-file: the file holds the list
// ParseKeyring reads, and whitespace and line breaks around it and around each key
// are ignored. A file keeps the keys off command lines and out of the container's
// configuration (`docker inspect`, a Pod's spec), where the flag's variable shows
// them. A file that holds no key is an error, not "no encryption": it is a secret
// that was not mounted or not filled in, and starting without keys would store new
// keys in the clear. Errors name the flag and the path, never a key.
func ReadKeyringFile(path string) (Keyring, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", fileFlag, err)
	}
	defer f.Close()
	name := fileFlag + " " + path
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", fileFlag, err)
	}
	if err := checkKeyFileMode(name, fi); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, maxKeyringFile+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", fileFlag, err)
	}
	if len(b) > maxKeyringFile {
		return nil, fmt.Errorf("%s: larger than %d KiB, which no list of keys is", name, maxKeyringFile>>10)
	}
	k, err := parseKeyring(name, string(b))
	if err != nil {
		return nil, err
	}
	if len(k) == 0 {
		return nil, fmt.Errorf("%s: the file holds no key (a secret not mounted, or empty?)", name)
	}
	return k, nil
}

// parseKeyring is ParseKeyring with name, the flag (and file) the list came from,
// in its errors.
func parseKeyring(name, s string) (Keyring, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	k := make(Keyring, 0, len(parts))
	for i, p := range parts {
		key, err := parseKey(strings.TrimSpace(p))
		if err != nil {
			return nil, fmt.Errorf("%s: key %d of %d: %w", name, i+1, len(parts), err)
		}
		k = append(k, key)
	}
	if err := k.validate(name); err != nil {
		return nil, err
	}
	return k, nil
}

func parseKey(s string) ([]byte, error) {
	if s == "" {
		return nil, errors.New("empty (two commas in a row, or a trailing comma?)")
	}
	if strings.ContainsAny(s, "\r\n") {
		// Go's base64 skips line breaks: two keys on two lines would otherwise be
		// read as one key of 64 bytes, a puzzling error.
		return nil, errors.New("holds a line break: separate keys with commas")
	}
	for _, enc := range []*base64.Encoding{
		base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding,
	} {
		b, err := enc.DecodeString(s)
		if err != nil {
			continue
		}
		if len(b) != KeySize {
			return nil, fmt.Errorf("must be base64 of %d bytes, got %d bytes", KeySize, len(b))
		}
		return b, nil
	}
	return nil, fmt.Errorf("not base64 (expected base64 of %d random bytes, e.g. from `openssl rand -base64 32`)", KeySize)
}

// Validate checks every key's size, and that no two keys share a key id (the same
// key given twice is fine).
func (k Keyring) Validate() error { return k.validate(flag) }

func (k Keyring) validate(name string) error {
	seen := make(map[string][]byte, len(k))
	for i, key := range k {
		if len(key) != KeySize {
			return fmt.Errorf("%s: key %d of %d must be %d bytes, got %d", name, i+1, len(k), KeySize, len(key))
		}
		id := KeyID(key)
		if other, ok := seen[id]; ok && string(other) != string(key) {
			return fmt.Errorf("%s: keys share the key id %s: generate another key", name, id)
		}
		seen[id] = key
	}
	return nil
}

// KeyID is the id a v2 sealed key names its key by: the first KeyIDSize bytes of
// SHA-256 of the key, in lower case hexadecimal.
func KeyID(key []byte) string {
	sum := sha256.Sum256(key)
	return hex.EncodeToString(sum[:KeyIDSize])
}

// IDs is the key id of every key, in order.
func (k Keyring) IDs() []string {
	ids := make([]string, len(k))
	for i, key := range k {
		ids[i] = KeyID(key)
	}
	return ids
}

// SealedKeyID is the key id a stored key names: that of a v2 sealed key, "" for v1
// (which names none), PEM and anything else. It does not check that the rest is
// well formed.
func SealedKeyID(stored string) string {
	rest, ok := strings.CutPrefix(strings.TrimSpace(stored), PrefixV2)
	if !ok {
		return ""
	}
	id, _, ok := strings.Cut(rest, ":")
	if !ok {
		return ""
	}
	return id
}

// SealingKeyID is the id of the key Seal uses, or "" for an empty Keyring.
func (k Keyring) SealingKeyID() string {
	if len(k) == 0 {
		return ""
	}
	return KeyID(k[0])
}

// Seal returns what is stored for a private key: with no key the PEM itself,
// otherwise the PEM sealed in the v2 format under the first key, with aad as
// additional authenticated data (for a certificate's key the name of its
// proxy_certificates row in lower case, *.base for a wildcard's; for an account's
// the directory URL).
func (k Keyring) Seal(plaintextPEM []byte, aad string) (string, error) {
	if len(k) == 0 {
		return string(plaintextPEM), nil
	}
	nonce := make([]byte, nonceSize)
	if _, err := rand.Read(nonce); err != nil {
		return "", fmt.Errorf("seal key: %w", err)
	}
	return sealV2(k[0], nonce, plaintextPEM, aad)
}

// sealV2 is the v2 format of plaintextPEM sealed under key with nonce. Seal draws a
// new random nonce for every key; the test vectors (testdata/vectors.json) give one,
// so that the same text comes out.
func sealV2(key, nonce, plaintextPEM []byte, aad string) (string, error) {
	gcm, err := newGCM(key)
	if err != nil {
		return "", err
	}
	if len(nonce) != gcm.NonceSize() {
		return "", fmt.Errorf("seal key: a nonce of %d bytes, not %d", len(nonce), gcm.NonceSize())
	}
	sealed := gcm.Seal(append(make([]byte, 0, nonceSize+len(plaintextPEM)+tagSize), nonce...), nonce, plaintextPEM, []byte(aad))
	return PrefixV2 + KeyID(key) + ":" + base64.StdEncoding.EncodeToString(sealed), nil
}

// Open is the inverse of Seal, for every format: PEM is returned as it is (a key
// uploaded by hand, or stored before keys were set, keeps working); v2 is opened
// with the key its id names; v1, which names no key, with each key in turn.
func (k Keyring) Open(stored, aad string) ([]byte, error) {
	s := strings.TrimSpace(stored)
	if strings.HasPrefix(s, "-----BEGIN ") {
		return []byte(stored), nil
	}
	rest, ok := strings.CutPrefix(s, family)
	if !ok {
		return nil, ErrFormat
	}
	version, rest, ok := strings.Cut(rest, ":")
	if !ok || (version != "v1" && version != "v2") {
		return nil, fmt.Errorf("sealed key of unknown version %q (this build reads v1 and v2)", version)
	}
	if len(k) == 0 {
		return nil, ErrNoKey
	}
	candidates := k
	if version == "v2" {
		var id string
		if id, rest, ok = strings.Cut(rest, ":"); !ok {
			return nil, errors.New("sealed key: v2 without a key id")
		}
		if candidates = k.withID(id); len(candidates) == 0 {
			return nil, fmt.Errorf("%w (key id %s)", ErrUnknownKey, id)
		}
	}
	raw, err := base64.StdEncoding.DecodeString(rest)
	if err != nil {
		return nil, fmt.Errorf("sealed key: bad base64: %w", err)
	}
	if len(raw) < nonceSize+tagSize {
		return nil, errors.New("sealed key: too short")
	}
	for _, key := range candidates {
		gcm, err := newGCM(key)
		if err != nil {
			return nil, err
		}
		if plain, err := gcm.Open(nil, raw[:nonceSize], raw[nonceSize:], []byte(aad)); err == nil {
			return plain, nil
		}
	}
	return nil, ErrUnseal
}

// Current reports whether stored is already what Seal writes now: v2 under the
// first key, or PEM when the Keyring is empty. `certworker rekey` re-seals the rest.
// It does not check that the key opens.
func (k Keyring) Current(stored string) bool {
	if len(k) == 0 {
		return !IsSealed(stored)
	}
	return strings.HasPrefix(strings.TrimSpace(stored), PrefixV2+KeyID(k[0])+":")
}

// IsSealed reports whether a stored key is in the sealed format, of any version.
func IsSealed(stored string) bool {
	return strings.HasPrefix(strings.TrimSpace(stored), family)
}

// withID is the keys whose id is id: one, or none; two only if the same key was
// given twice.
func (k Keyring) withID(id string) Keyring {
	var out Keyring
	for _, key := range k {
		if KeyID(key) == id {
			out = append(out, key)
		}
	}
	return out
}

func newGCM(key []byte) (cipher.AEAD, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("%s: must be %d bytes, got %d", flag, KeySize, len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}
