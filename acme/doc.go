// Package acme turns a domain name into a certificate over ACME (RFC 8555), with
// lego. It implements queue.Issuer; it knows nothing of the queue's states.
//
// # Overview
//
// Issuer.Issue places one order for one name, answers its HTTP-01 challenge, and
// returns the chain, the new key (sealed when a key encryption key is set) and the
// time to renew. Every order has a new key of --key-type. A renewal names the
// certificate it replaces (RFC 9773 "replaces"); the renewal time comes from the
// CA's ACME Renewal Information when it offers it (a uniformly random point of its
// suggested window), otherwise from RenewAtFromValidity (a third of the lifetime
// before expiry).
//
// # Account
//
// One ACME account per directory URL and external account binding key id, stored in
// certworker_acme_accounts and shared by every instance and every restart. It is
// registered by the first order that needs it, not at start, so a CA that is down at
// start fails orders (retried with backoff) rather than the worker. Instances that
// start together serialise the registration on a transaction-scoped advisory lock
// and end up with one account. The terms of service are agreed to on registration.
// An account the CA no longer knows (accountDoesNotExist) is deleted, and the next
// order registers a new one.
//
// # HTTP-01
//
// Only HTTP-01 is answered. The order's instance stores the token and key
// authorization in certworker_http01_tokens and commits before lego asks the CA to
// validate; HTTP01Handler, served by every instance on --http01-listen, answers from
// that table, so the CA's validation request may reach any instance. The order
// deletes its token when the challenge is decided; a token left behind by an
// instance that died expires after an hour and is then neither served nor kept.
//
// # Failures
//
//   - A rate limit (problem type urn:ietf:params:acme:error:rateLimited, or any HTTP
//     429) is a *queue.RateLimitError with the CA's Retry-After (0 when it gave
//     none). The worker does not charge it to the domain and pauses the CA.
//   - Another ACME problem is an *Error: "acme: <problem type>: <detail>".
//   - Anything else (the CA unreachable, an answer that is not ACME) is a plain
//     error starting "acme: ".
//
// Messages are at most 1,000 bytes, never hold key material, and nothing panics.
// lego's calls take no context; every request to the CA carries the order's, and
// Issue returns as soon as it is cancelled.
//
// # Keys at rest
//
// Private keys, the certificates' (proxy_certificates.private_key_pem) and the
// account's (certworker_acme_accounts.private_key_pem), are PEM, PKCS #8
// ("-----BEGIN PRIVATE KEY-----"). Without --key-encryption-key they are stored as
// that PEM; with it they are sealed by package certstore/seal (whose documentation,
// and README.md, give the format), bound to the row: the domain name in lower case
// for a certificate's key, the directory URL for the account's. Private keys never
// reach a log.
package acme
