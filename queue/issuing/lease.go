package issuing

import "errors"

// ErrClaimBusy: ConfirmClaim found the claim held and unexpired, but another
// transaction had the row locked (the proxy's open write), so it could not renew the
// lease this time.
var ErrClaimBusy = errors.New("the claim's row is locked by another transaction: lease not renewed")
