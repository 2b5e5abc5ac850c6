package issuing

import "errors"

// ErrClaimBusy: ConfirmClaim found the claim held but its row locked, and could not
// renew the lease this time.
var ErrClaimBusy = errors.New("the claim's row is locked by another transaction: lease not renewed")
