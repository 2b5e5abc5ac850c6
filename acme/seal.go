package acme

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// SealedPrefix starts every sealed key; the format is described in doc.go ("Keys at
// rest"). Named because the proxy matches the same string to tell a sealed key from
// a PEM one, and the two have to agree.
const SealedPrefix = "certworker:aes256gcm:v1:"

// sealedFamily is SealedPrefix without its version, to recognise a sealed key of a
// version this build does not know and say so, rather than "unknown format".
const sealedFamily = "certworker:aes256gcm:"

const (
	// KeyEncryptionKeySize is the AES-256 key size: --key-encryption-key is base64 of
	// exactly this many bytes.
	KeyEncryptionKeySize = 32
	// nonceSize is GCM's standard nonce. Random nonces are safe for far more keys than
	// a worker will ever seal under one key encryption key (NIST SP 800-38D allows
	// 2^32 messages per key with random 96-bit nonces).
	nonceSize = 12
	tagSize   = 16
)

var (
	// ErrNoKeyEncryptionKey: a sealed key was found but no --key-encryption-key is set.
	ErrNoKeyEncryptionKey = errors.New("the key is sealed (certworker:aes256gcm) but no --key-encryption-key is set")
	// ErrUnseal: the key encryption key is not the one the key was sealed with, or
	// the sealed key was moved to another row (its AAD differs), or it was altered.
	ErrUnseal = errors.New("cannot open the sealed key: wrong --key-encryption-key, key moved from another row, or altered")
	// ErrKeyFormat: the stored key is neither PEM nor a sealed key.
	ErrKeyFormat = errors.New("stored key is neither PEM nor a sealed key (" + sealedFamily + "v1:...)")
)

// Seal returns what is stored for a private key. Without a key encryption key
// (kek == nil) that is the PEM itself; with one it is the PEM encrypted with
// AES-256-GCM under kek, with aad as additional authenticated data, in the text
// format of doc.go. aad binds the key to its row: the domain name for a certificate's
// key, the directory URL for an ACME account's.
func Seal(kek, plaintextPEM []byte, aad string) (string, error) {
	if len(kek) == 0 {
		return string(plaintextPEM), nil
	}
	gcm, err := newGCM(kek)
	if err != nil {
		return "", err
	}
	nonce := make([]byte, nonceSize, nonceSize+len(plaintextPEM)+tagSize)
	if _, err := rand.Read(nonce); err != nil {
		return "", fmt.Errorf("seal key: %w", err)
	}
	sealed := gcm.Seal(nonce, nonce, plaintextPEM, []byte(aad))
	return SealedPrefix + base64.StdEncoding.EncodeToString(sealed), nil
}

// Open is the inverse of Seal. A stored value that is PEM is returned as it is, with
// or without kek, so that a key uploaded by hand (or stored before a key encryption
// key was set) keeps working.
func Open(kek []byte, stored string, aad string) ([]byte, error) {
	s := strings.TrimSpace(stored)
	if strings.HasPrefix(s, "-----BEGIN ") {
		return []byte(stored), nil
	}
	rest, ok := strings.CutPrefix(s, sealedFamily)
	if !ok {
		return nil, ErrKeyFormat
	}
	version, payload, ok := strings.Cut(rest, ":")
	if !ok || version != "v1" {
		return nil, fmt.Errorf("sealed key of unknown version %q (this build reads v1)", version)
	}
	if len(kek) == 0 {
		return nil, ErrNoKeyEncryptionKey
	}
	gcm, err := newGCM(kek)
	if err != nil {
		return nil, err
	}
	raw, err := base64.StdEncoding.DecodeString(payload)
	if err != nil {
		return nil, fmt.Errorf("sealed key: bad base64: %w", err)
	}
	if len(raw) < nonceSize+tagSize {
		return nil, errors.New("sealed key: too short")
	}
	plain, err := gcm.Open(nil, raw[:nonceSize], raw[nonceSize:], []byte(aad))
	if err != nil {
		return nil, ErrUnseal
	}
	return plain, nil
}

// IsSealed reports whether a stored key is in the sealed format (of any version).
func IsSealed(stored string) bool {
	return strings.HasPrefix(strings.TrimSpace(stored), sealedFamily)
}

// ParseKeyEncryptionKey decodes --key-encryption-key: base64 (standard or URL
// alphabet, padded or not) of 32 bytes. "" is no key (nil). The error never
// contains the value.
func ParseKeyEncryptionKey(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	for _, enc := range []*base64.Encoding{
		base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding,
	} {
		b, err := enc.DecodeString(s)
		if err != nil {
			continue
		}
		if len(b) != KeyEncryptionKeySize {
			return nil, fmt.Errorf("--key-encryption-key: must be base64 of %d bytes, got %d bytes",
				KeyEncryptionKeySize, len(b))
		}
		return b, nil
	}
	return nil, fmt.Errorf("--key-encryption-key: not base64 (expected base64 of %d random bytes, e.g. from `openssl rand -base64 32`)",
		KeyEncryptionKeySize)
}

func newGCM(kek []byte) (cipher.AEAD, error) {
	if len(kek) != KeyEncryptionKeySize {
		return nil, fmt.Errorf("--key-encryption-key: must be %d bytes, got %d", KeyEncryptionKeySize, len(kek))
	}
	block, err := aes.NewCipher(kek)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}
