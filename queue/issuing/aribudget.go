package issuing

import "errors"

// DefaultRenewalInfoPerSecond is --ari-requests-per-second: a million certificates
// at a six-hour Retry-After is 46 a second, and 50 leaves room for retries and jitter.
const DefaultRenewalInfoPerSecond = 50.0

// ErrBadRate: a renewal-information rate that is not a positive number.
var ErrBadRate = errors.New("the renewal-information rate must be a positive number of requests a second")
