// Package acme turns a domain name into a certificate over ACME (RFC 8555), with
// lego. It implements issuing.Issuer; it knows nothing of the queue's states.
//
// # Overview
//
// Issuer.Issue runs the preflight, places one order for one name, answers its
// HTTP-01 challenge, and returns the chain, the new key (sealed when a key
// encryption key is set), the time to renew, the end of the CA's renewal window and
// when to ask the CA about it again. Every order has a new key of --key-type. A
// renewal names the certificate it replaces (RFC 9773 "replaces"); the renewal time
// comes from the CA's ACME Renewal Information when it offers it (a uniformly random
// point of its suggested window, never in the certificate's last tenth:
// issuing.RenewAtFromWindow), otherwise from RenewAtFromValidity (a third of the lifetime
// before expiry, half of it below 10 days). Issuer.RenewalInfo asks the CA again for a stored certificate
// (issuing.RenewalInformer), so that a window the CA moves earlier is acted on.
//
// An order is driven step by step on lego's protocol layer (api.Core: JWS,
// nonces, problem documents), not lego's Certifier.Obtain, which hides the order:
// the issuer needs to know which step failed, to deactivate what a failed order
// left pending, and to wait between polls on the order's context.
//
// After the challenge's answer and after the finalize, the order looks at the CA's
// work at the CA's Retry-After when it gives one, otherwise on a curve (poll.go):
// 25 ms (10 ms after the finalize), then at most max(100 ms, a quarter of the time
// waited) after the last look, so that the CA's verdict is seen at most that long
// after it was given, whatever the CA takes; docs/internals.md ("Polling the CA")
// has what it costs in requests.
//
// # Sharing with the CA
//
// The account, the CA's directory and the nonces the CA handed out are shared by
// every order of an Issuer (session): after its first order, an order sends the CA
// only the requests it needs (8 at Pebble: new order, authorization, challenge, one
// poll of the authorization, finalize, one poll of the order, certificate, renewal
// information; 11 with a lego client per order). Each order still has its own lego
// core and HTTP transport, whose requests carry the order's context: lego's calls
// take none, and that is what cancels an order on its own.
//
// # Account
//
// One ACME account per directory URL and external account binding key id, stored in
// certworker_acme_accounts and shared by every instance and every restart. It is
// registered by the first order that needs it, not at start, so a CA that is down at
// start fails orders (retried, uncharged) rather than the worker. The account's key is
// stored first (INSERT ... ON CONFLICT DO NOTHING, with an empty account URL), then
// registered with the CA outside any transaction and the URL recorded: instances that
// start together register the one stored key, which a CA answers with the same
// account (RFC 8555 §7.3.1), and end up with one account, with no lock held while the
// CA answers. The terms of service are agreed to on registration.
// An account the CA no longer knows (accountDoesNotExist) is deleted, and the next
// order registers a new one.
//
// # Preflight
//
// With Config.Preflight "http" (--preflight http, the command line's default), an
// order is preceded by what the CA's validation will do: the name is resolved
// (Config.PreflightResolver, or the system's resolver), and
// http://NAME:PORT/.well-known/acme-challenge/TOKEN is fetched for a random probe
// token stored like an HTTP-01 token (so any instance's responder answers it, and
// deleted after), following redirects by the CA's rules. When it fails, nothing is
// sent to the CA and Issue returns a *issuing.PreflightError saying what was seen: no
// such name, no answer at ADDRESS, or answered by something else, with its status
// code (never the server's body, reason phrase or other words: the tenant reads
// ssl_error). A resolver that does not answer at all lets the order go: that is the
// worker's trouble, not the name's.
//
// The preflight never connects to a reserved address (reserved.go: loopback,
// private, link-local, CGNAT, multicast, NAT64, ... from IANA's special-purpose
// registries) unless Config.PreflightAllowCIDR allows it: a name with any such
// address among its answers, or a redirect to one, fails with "NAME resolves to a
// reserved address (A.B.C.D)", and the dialer's Control hook checks the address
// every connection is about to use, after unmapping IPv4-in-IPv6.
//
// # CAA
//
// CheckCAA (caa.go) reads a name's CAA records through a CAAResolver (the
// preflight's --preflight-resolver, or the system's), climbing the tree as RFC 8659
// §3 says, and decides for each CA (CAAIssuer: its identities, the account it orders
// with, http-01) whether its issue or issuewild properties, their RFC 8657
// accounturi and validationmethods parameters, and any critical property allow it.
// A failed look-up is a *CAAError ("caa: ..."), charged and retried; records that
// allow none of the CAs give a verdict whose Err is a *issuing.PermanentError naming
// the issuer domain names they allow. Issuer.CAAIssuer gives an issuer's CA: its
// Config.CAAIdentities (--acme-caa-identities), else its directory's
// meta.caaIdentities. Issue itself reads no CAA: the worker, which knows every CA it
// could send the order to, decides which one is asked.
//
// # External account binding
//
// With Config.EABKeyID the account is registered with an external account binding
// (the HMAC key from --acme-eab-hmac or ReadEABHMACFile). A registration the CA
// refuses for its binding is an *EABRefusedError (never holding the key): `run`
// exits 2 on it at start (RegisterAccount), and Issue returns it inside a
// *issuing.CAUnavailableError (not charged).
//
// # HTTP-01
//
// Only HTTP-01 is answered. The order's instance stores the token and key
// authorization in certworker_http01_tokens and commits before it asks the CA to
// validate; the Responder, served by every instance on --http01-listen, answers from
// that table, so the CA's validation request may reach any instance. It holds the
// pending tokens in memory, kept current by a notification on every change of the
// table, so that a request for any other token costs no query (a miss is looked up at
// most 50 times a second) and a token it holds is answered while the database is
// away. (HTTP01Handler is a Responder that is not started: it answers from the
// database alone, for tests and the demo.) The order
// deletes its token when the challenge is decided; a token left behind by an
// instance that died expires after an hour and is then neither served nor kept.
// After a failed or abandoned order, its authorizations that may still be pending
// are deactivated (they count against the CA's limits until they expire).
//
// # Failures
//
// Issue returns what issuing.Issuer asks for (classify):
//
//   - *issuing.RateLimitError for a rate limit (problem type rateLimited, or any HTTP
//     429), with the CA's Retry-After (0 when it gave none), the reach of the limit
//     its detail names (Let's Encrypt's texts, old and new: see rateLimits) and the
//     limit's name (Limit*). Not charged; paused by reach.
//   - *issuing.CAUnavailableError when the CA could not be reached at some step (no
//     connection, a reset, a request that timed out) or answered 5xx. Not charged.
//   - *issuing.PreflightError when the preflight failed; nothing was sent to the CA.
//   - *issuing.PermanentError for a refusal no retry can fix, with the CA's problem
//     in the message: rejectedIdentifier, unsupportedIdentifier, caa (also as a
//     subproblem), and Let's Encrypt's pause of the account and name after many
//     failed validations, with the link that lifts it.
//   - *Error for another ACME problem: "acme: <problem type>: <detail>". One that
//     is the CA's verdict on the order's authorization (a failed validation) is a
//     issuing.AuthorizationFailure.
//   - a plain error starting "acme: " for anything else (an answer that is not
//     ACME, a database error).
//
// A renewal refused because of its "replaces" is ordered again, once, without it.
// Messages are at most 1,000 bytes, never hold key material, and nothing panics.
// Issue returns as soon as its context is cancelled.
//
// # Keys at rest
//
// Private keys, the certificates' (proxy_certificates.private_key_pem) and the
// account's (certworker_acme_accounts.private_key_pem), are PEM, PKCS #8
// ("-----BEGIN PRIVATE KEY-----"). Without --key-encryption-key they are stored as
// that PEM; with it they are sealed by package certstore/seal (whose documentation,
// and docs/security.md, give the format), bound to the row: the domain name in lower case
// for a certificate's key, the directory URL for the account's. Private keys never
// reach a log.
package acme
