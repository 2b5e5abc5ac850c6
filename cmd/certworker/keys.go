package main

import (
	"github.com/certworker/certworker/certstore/seal"
)

// keyFlags are the key encryption keys of run and rekey: the list on the command line
// (or its variable), or the same list read from a file, which keeps the keys off
// command lines (ps) and out of the container's configuration (docker inspect, the
// Pod's spec), where a variable shows them.
type keyFlags struct {
	KeyEncryptionKey     string `name:"key-encryption-key" env:"CERTWORKER_KEY_ENCRYPTION_KEY" placeholder:"BASE64[,BASE64...]" help:"Comma-separated base64 keys of 32 bytes that seal private keys at rest (AES-256-GCM): the first seals, any opens. Prefer --key-encryption-key-file."`
	KeyEncryptionKeyFile string `name:"key-encryption-key-file" env:"CERTWORKER_KEY_ENCRYPTION_KEY_FILE" placeholder:"FILE" help:"A file holding the --key-encryption-key list (surrounding whitespace and line breaks ignored); not with --key-encryption-key."`
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
