package pebbletest

import (
	"net/http"
	"path"

	"github.com/letsencrypt/pebble/v2/acme"
)

// SetReplacesAsBoulder makes the front refuse a new order naming a certificate that
// an order the CA holds already names, while that order is pending, ready,
// processing or valid, with 409 alreadyReplaced, as Boulder does. Pebble refuses only
// once the replacing order has issued.
func (f *Front) SetReplacesAsBoulder(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.boulderReplaces = on
}

// alreadyReplaced answers a new order for replaces with alreadyReplaced when the
// front is in Boulder's mode and a live order names it; it reports whether it did.
func (f *Front) alreadyReplaced(w http.ResponseWriter, r *http.Request, replaces string) bool {
	f.mu.Lock()
	on := f.boulderReplaces
	f.mu.Unlock()
	if !on || replaces == "" || !f.ca.liveReplacement(replaces) {
		return false
	}
	Answer{Status: http.StatusConflict, Problem: &Problem{
		Type:   "urn:ietf:params:acme:error:alreadyReplaced",
		Detail: "the certificate has already been replaced by an order in progress",
	}}.write(w, r)
	return true
}

// liveReplacement reports whether an order the CA accepted names replaces and is
// pending, ready, processing or valid.
func (c *CA) liveReplacement(replaces string) bool {
	for _, o := range c.Orders() {
		if o.Replaces != replaces {
			continue
		}
		po := c.store.GetOrderByID(path.Base(urlPath(o.URL)))
		if po == nil {
			continue
		}
		po.RLock()
		status := po.Status
		po.RUnlock()
		switch status {
		case acme.StatusPending, acme.StatusReady, acme.StatusProcessing, acme.StatusValid:
			return true
		}
	}
	return false
}
