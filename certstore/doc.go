// Package certstore serves, to a Go TLS server, the certificates certworker stores in
// PostgreSQL: the proxy plugs it into crypto/tls and a tenant's new certificate is
// presented within milliseconds of its commit.
//
//	store, err := certstore.Open(ctx, pool, certstore.Options{KeyEncryptionKeys: keks, Logger: log})
//	if err != nil { ... }
//	defer store.Close()
//	srv := &http.Server{TLSConfig: &tls.Config{GetCertificate: store.GetCertificate}}
//
// It depends on pgx, zap, golang.org/x/sync and the standard library (and
// certstore/seal), never on the ACME client: a proxy importing it does not import
// lego. Package certstore/loopback serves HTTPS from a tls.Config on 127.0.0.1 and
// opens https://NAME through it, for tests and demos.
//
// # What is served
//
// A handshake's server name (SNI), in lower case, is served the certificate that
// certworker_certificate_for, the SQL function certworker's migrate creates, returns
// for it: the serving rule is written there once, for this package and for proxies
// in any language (docs/proxy-integration.md). In short:
//   - a name with a verified domain row of its own, whatever its tenant, is served
//     that row's certificate or none; of rows differing only in case, the verified
//     acme row that keeps the name (two verified rows neither from ACME: neither);
//   - a name with no verified row of its own is served the certificate of the
//     wildcard one label above it (www.shop.example: *.shop.example), when that
//     wildcard's row is verified, as TLS matching does;
//   - whatever the domain's ssl_status (a renewal under way, a failed renewal) and
//     its ssl_provider (a manual upload too).
//
// The store then checks what the function cannot: the key opens (PEM, or sealed
// under one of KeyEncryptionKeys, bound to the certificate row's name in lower case,
// *.base for a wildcard), the certificate is valid now and it covers the name. A
// notification for a wildcard reloads every name it serves that is held.
//
// Anything else is an error from GetCertificate and a failed handshake: never another
// name's certificate, never a default one, and no query at all for a hello without a
// usable name.
//
// # Cache
//
// A name is loaded on its first handshake (one query, shared by every handshake that
// waits for it, at most MaxLoads at a time) and kept. An answer of "not served" is
// kept for MissTTL, so a flood of handshakes for unknown names costs one query per
// name per MissTTL. A certificate is checked again after TTL: served meanwhile, and
// reloaded in the background, the query skipping the certificate when the function
// still answers with the row and version held. A certificate past its notAfter is never served.
//
// # Changes
//
// The store holds one connection of its own, LISTENing on Channel
// (certworker_certificate). Migration 00007's triggers notify it, with the name as
// payload, when a certificate row is inserted, replaced or deleted, and when a
// verified domain is unverified, renamed or deleted; migration 00024's, when a name
// under a wildcard's domain row becomes verified (it is then served its own
// certificate or none, no longer the wildcard's). A notified name held in memory
// is reloaded at once in the background; the next handshake presents what the
// database holds.
//
// Which of two reads of a row is newer is judged by the database: the read that
// began after more notifications wins, and between reads that began together the
// row with the higher version (a sequence drawn by the trigger on every write), not
// the certificate with the later dates, so an operator's replacement is served even
// when it is older than what it replaces.
//
// # Failures
//
// The connection is checked after PingAfter of silence and re-established with
// jittered exponential backoff (BackoffMin to BackoffMax), as package listener does.
// Notifications sent while it was down are lost, so after each reconnection the
// store compares, in batches of 1,000, the row and version of every certificate it
// holds with what certworker_certificate_for answers now, reloads the ones that
// moved and forgets its misses.
//
// While PostgreSQL is down the store serves what it holds, past TTL and past a
// notification alike, and tries the database for a name at most once a second;
// a name it holds nothing for gets ErrUnavailable. Open fails if the database cannot
// be reached at all, so a bad connection string is found at start.
package certstore
