package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/certstore/seal"
	"github.com/certworker/certworker/queue/issuing"
)

// keyFlags are the key encryption keys of run and rekey: the list on the command line
// (or its variable), or the same list read from a file, which keeps the keys off
// command lines (ps) and out of the container's configuration (docker inspect, the
// Pod's spec), where a variable shows them.
type keyFlags struct {
	KeyEncryptionKey     string `name:"key-encryption-key" env:"CERTWORKER_KEY_ENCRYPTION_KEY" placeholder:"BASE64[,BASE64...]" group:"keys" help:"Comma-separated base64 keys of 32 bytes that seal private keys at rest (AES-256-GCM): the first seals, any opens. Prefer --key-encryption-key-file."`
	KeyEncryptionKeyFile string `name:"key-encryption-key-file" env:"CERTWORKER_KEY_ENCRYPTION_KEY_FILE" placeholder:"FILE" group:"keys" help:"A file holding the --key-encryption-key list (surrounding whitespace and line breaks ignored); not with --key-encryption-key."`
}

// keyring reads the keys from whichever of the two flags is set: none is no key.
// Both set is a usage error rather than one beating the other: a variable left over
// from before a move to the file would otherwise decide which keys seal.
func (f keyFlags) keyring() (seal.Keyring, error) {
	if f.KeyEncryptionKeyFile != "" {
		if f.KeyEncryptionKey != "" {
			return nil, usagef("--key-encryption-key and --key-encryption-key-file are both set (as flags or as CERTWORKER_ variables): give the keys one way")
		}
		keys, err := seal.ReadKeyringFile(f.KeyEncryptionKeyFile)
		if err != nil {
			return nil, usagef("%v", err)
		}
		return keys, nil
	}
	keys, err := seal.ParseKeyring(f.KeyEncryptionKey)
	if err != nil {
		return nil, usagef("%v", err)
	}
	return keys, nil
}

// logKeys says at start whether new private keys will be sealed, and under which key
// id (never a key), and sets /metrics' certworker_key_encryption_enabled: an operator
// who meant to encrypt and forgot the flag sees it before the first key is stored.
func logKeys(log *zap.Logger, reg prometheus.Registerer, keys seal.Keyring) {
	enabled := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "certworker_key_encryption_enabled",
		Help: "1 when this instance seals new private keys (--key-encryption-key or --key-encryption-key-file), 0 when it stores them as PEM.",
	})
	reg.MustRegister(enabled)
	if len(keys) == 0 {
		log.Info("new private keys will be stored in plaintext (PEM): no --key-encryption-key or --key-encryption-key-file",
			zap.Bool("sealed", false))
		return
	}
	enabled.Set(1)
	log.Info("new private keys will be sealed (AES-256-GCM)", zap.Bool("sealed", true),
		zap.String("sealing_key_id", keys.SealingKeyID()), zap.Strings("key_ids", keys.IDs()))
}

// checkAccountKey opens the stored ACME account key with the configured keys before
// anything is claimed, as run promises (exit 2): a key sealed under a key this instance lacks
// would fail every order, so it is a configuration error (exit 2) naming the key id,
// not a thousand failed domains. No account stored yet is fine.
func checkAccountKey(ctx context.Context, issuer *acme.Issuer, databaseURL string) error {
	err := issuer.CheckAccountKey(ctx)
	var ke *issuing.KeyError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ke):
		return usagef("%s: start with the key it was sealed with in --key-encryption-key (or --key-encryption-key-file)", ke)
	}
	return usagef("--database-url: read the ACME account: %s", redact(err.Error(), databaseURL))
}

// keysReady is the part of /readyz about keys: an error while the worker stopped
// claiming on a key error, or while the stored account key does not open with the
// configured keys (docs/reference.md, "Admin endpoints"; read afresh at every check, so that an instance
// left behind by a rotation shows before its next order meets it).
func keysReady(ctx context.Context, wk workerState, issuer *acme.Issuer, conn acme.Queryer) error {
	if err := wk.Halted(); err != nil {
		var ke *issuing.KeyError
		if errors.As(err, &ke) {
			return fmt.Errorf("stopped claiming until restarted with the key: %w", err)
		}
		return err // the CA does not offer --acme-profile (worker.ProfileHalt)
	}
	err := issuer.CheckAccountKeyOn(ctx, conn)
	var ke *issuing.KeyError
	if errors.As(err, &ke) {
		return ke
	}
	if err != nil {
		return errors.New("cannot read the stored ACME account")
	}
	return nil
}
