// Package issuing is what the queue and an issuer agree on, with no database behind
// it: the issuer contract, the claim a worker holds, the typed errors an order can end
// in, and the pure rules the store and the worker both apply (names, renewal times,
// backoff, CA choice, limits). It imports nothing of certworker's.
package issuing
