// Package issuing is what the queue and an issuer agree on, with no database behind
// it: the issuer contract (Issuer, Request, Certificate), the claim a worker holds
// (Claim, Deadline), the typed errors an order can end in, and the pure rules the
// store's statements and the worker both apply: which names can be ordered
// (CheckName), when a certificate is renewed (RenewAtFromValidity,
// RenewAtFromWindow), the retry curve (Config.Backoff), which CA an order goes to
// (Decide), and the ledger's limits and their parsing (ParseLimit).
//
// It imports nothing of certworker's, so that an issuer (package acme) depends on
// it and not on the store (package queue), and the store and the worker share one
// spelling of each rule.
package issuing
