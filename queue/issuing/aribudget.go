package issuing

import "errors"

// DefaultRenewalInfoPerSecond is --ari-requests-per-second: the renewal-information
// requests the whole fleet sends one CA in a second. Asking about a million
// certificates at Let's Encrypt's Retry-After of six hours is 1,000,000 / 21,600 s =
// 46 a second; 50 keeps up with that, with room for the questions after an error
// (asked again an hour later) and for the jitter.
const DefaultRenewalInfoPerSecond = 50.0

// ErrBadRate: a renewal-information rate that is not a positive number.
var ErrBadRate = errors.New("the renewal-information rate must be a positive number of requests a second")
