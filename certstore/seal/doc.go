// Package seal encrypts private keys at rest: the certificates' keys in
// proxy_certificates.private_key_pem and the ACME account's key in
// certworker_acme_accounts.private_key_pem. It is what the worker seals with and what
// a reader (the proxy, package certstore) opens with, and it depends on the standard
// library alone, so that a proxy reading keys does not pull in an ACME client.
//
// # Format
//
// A stored key is one of:
//
//   - PEM text ("-----BEGIN ..."): written without a key encryption key, or uploaded
//     by hand. Read as it is, with or without keys.
//   - v2, written by this version:
//     certworker:aes256gcm:v2:<key id>:<base64(nonce || ciphertext || tag)>
//   - v1, written before key rotation existed, and still read:
//     certworker:aes256gcm:v1:<base64(nonce || ciphertext || tag)>
//
// The cipher is AES-256-GCM under a 32-byte key encryption key; the plaintext is the
// key's PEM text; nonce is 12 random bytes, new for every key sealed; tag is GCM's 16
// bytes, appended to the ciphertext; base64 is the standard alphabet with padding
// (RFC 4648 §4). The additional authenticated data is the row's identity in UTF-8:
// for a certificate's key the name of its proxy_certificates row in lower case
// (*.base for a wildcard's, whatever name a handshake asked for), for the account's
// the ACME directory URL, so a sealed key copied to another row does not open.
// testdata/vectors.json holds vectors a reader in another language checks itself
// against.
//
// The key id is the first 4 bytes of SHA-256 of the key encryption key, as 8 lower
// case hexadecimal digits: a stored key names the key that opens it, so a reader
// holding several keys during a rotation tries one, and `certworker rekey` can tell
// which keys are still sealed under an old one. Four bytes of a hash of a 256-bit
// random key tell nothing about the key.
//
// # Rotation
//
// A Keyring is a list of key encryption keys: the first seals, any of them opens. A
// reader must be able to open every format a writer may produce, so readers are
// upgraded (and given a new key) before any writer uses it; docs/security.md ("Private
// keys at rest") has the steps.
package seal
