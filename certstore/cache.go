package certstore

import (
	"crypto/tls"
	"strings"
	"sync"
	"time"
)

// entry is what the store knows of one name. Entries are never modified once in the
// map: a change replaces the pointer, so a reader holding one needs no lock.
//
// An entry holds a certificate (cert != nil), or a miss (miss != nil: why the name
// is not served), or neither while its first load runs (a placeholder, so that a
// notification arriving meanwhile is not lost).
type entry struct {
	cert     *tls.Certificate
	notAfter time.Time
	// version and domain say which certificate row cert was read from: its version
	// (0 for a row that has none) and its name in lower case (the name's own, or
	// the wildcard's that serves it).
	version int64
	domain  string
	miss    error
	// from is the epoch at which the load that produced this entry began, and
	// notified the epoch of the last notification for the name. notified > from:
	// the row changed after this was read.
	from, notified uint64
	// freshUntil is when the entry is checked again anyway (TTL, MissTTL).
	freshUntil time.Time
	// retryAt: until then an outdated certificate is served without asking the
	// database, which has just failed to answer.
	retryAt time.Time
}

func (e *entry) outdated() bool { return e.notified > e.from }

// servable: holds a certificate that is valid now.
func (e *entry) servable(now time.Time) bool { return e.cert != nil && now.Before(e.notAfter) }

// current: neither outdated nor due, so there is nothing to load.
func (e *entry) current(now time.Time) bool {
	return !e.outdated() && now.Before(e.freshUntil) && (e.servable(now) || e.isMiss())
}

func (e *entry) isMiss() bool { return e.cert == nil && e.miss != nil }

// cache is the store's memory: an entry per name, and the epoch, which counts the
// notifications and reconnections the store has seen.
type cache struct {
	// mu guards everything below.
	mu        sync.RWMutex
	entries   map[string]*entry
	epoch     uint64
	misses    int
	maxMisses int
}

func newCache(maxMisses int) cache {
	return cache{entries: make(map[string]*entry), epoch: 1, maxMisses: maxMisses}
}

func (c *cache) lookup(name string) *entry {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.entries[name]
}

// begin records that a load of name starts now: it returns the epoch and the entry
// as it is, leaving a placeholder where there was none.
func (c *cache) begin(name string) (uint64, *entry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[name]
	if e == nil {
		c.entries[name] = &entry{from: c.epoch}
	}
	return c.epoch, e
}

// notify marks name as changed: whatever is held for it was read before the change.
// It reports whether anything was held. A name the store has never been asked for
// is not remembered, as its first load reads the change anyway.
func (c *cache) notify(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch++
	return c.markLocked(name, c.epoch)
}

// servedBy are the names held one label below base, which a wildcard *.base may
// serve.
func (c *cache) servedBy(base string) []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []string
	for name := range c.entries {
		if _, parent, ok := strings.Cut(name, "."); ok && parent == base {
			out = append(out, name)
		}
	}
	return out
}

// outdate marks the given names as changed (after a reconnection, the ones whose
// version moved) and returns those of them that held a certificate.
func (c *cache) outdate(names []string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch++
	var certs []string
	for _, name := range names {
		if e := c.entries[name]; e != nil && e.cert != nil {
			certs = append(certs, name)
		}
		c.markLocked(name, c.epoch)
	}
	return certs
}

// outdateAll marks every name as changed.
func (c *cache) outdateAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch++
	for name := range c.entries {
		c.markLocked(name, c.epoch)
	}
}

// markLocked records a change of name at epoch. Called with mu held.
func (c *cache) markLocked(name string, epoch uint64) bool {
	e := c.entries[name]
	if e == nil {
		return false
	}
	cp := *e
	cp.notified = epoch
	c.entries[name] = &cp
	return true
}

// heldCert is which certificate row a name's certificate was read from.
type heldCert struct {
	version int64
	domain  string
}

// snapshot is every name holding a certificate, with the row it was read from, and
// every other name the cache holds.
func (c *cache) snapshot() (certs map[string]heldCert, others []string) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	certs = make(map[string]heldCert)
	for name, e := range c.entries {
		if e.cert != nil {
			certs[name] = heldCert{version: e.version, domain: e.domain}
		} else {
			others = append(others, name)
		}
	}
	return certs, others
}

// apply records the outcome of a load of name that began at epoch from, and returns
// what the cache holds for the name afterwards (what the waiting handshakes get).
//
// The newer of two reads is the one whose load began later (after more
// notifications); between two that began in the same epoch, the one with the higher
// row version. A read that began before the entry's own is dropped, so that a slow
// load never puts back a certificate a faster one already replaced.
func (c *cache) apply(name string, r *entry) *entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	cur := c.entries[name]
	placeholder := cur == nil || (cur.cert == nil && cur.miss == nil)
	keep := !placeholder && (r.from < cur.from ||
		(r.from == cur.from && cur.cert != nil && r.cert != nil && cur.version > r.version))
	if keep {
		return cur
	}
	if cur != nil {
		r.notified = max(r.notified, cur.notified)
	}
	c.setLocked(name, cur, r)
	return r
}

// unavailable records a load that could not reach the database: a certificate held
// is kept and served, without asking again, for unavailableRetry; a name with
// nothing to serve gets ErrUnavailable for as long.
func (c *cache) unavailable(name string, from uint64, err error, now time.Time) *entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	cur := c.entries[name]
	r := &entry{miss: err, from: from, freshUntil: now.Add(unavailableRetry)}
	if cur != nil && cur.cert != nil {
		cp := *cur
		cp.retryAt = now.Add(unavailableRetry)
		r = &cp
	} else if cur != nil && cur.miss != nil && cur.from > from {
		return cur
	}
	if cur != nil {
		r.notified = max(r.notified, cur.notified)
	}
	c.setLocked(name, cur, r)
	return r
}

// setLocked replaces cur with next, keeping the count of misses, and evicts misses
// when there are more than maxMisses. Called with mu held.
func (c *cache) setLocked(name string, cur, next *entry) {
	if cur != nil && cur.isMiss() {
		c.misses--
	}
	if next.isMiss() {
		c.misses++
		if c.misses > c.maxMisses {
			c.evictMissesLocked(time.Now())
		}
	}
	c.entries[name] = next
}

// evictMissesLocked brings the misses down to nine tenths of the cap: expired ones
// first, then any (map order is random). Evicting a tenth at a time keeps the cost
// per miss constant under a flood of random names. Called with mu held.
func (c *cache) evictMissesLocked(now time.Time) {
	target := c.maxMisses - c.maxMisses/10
	for _, expiredOnly := range []bool{true, false} {
		for name, e := range c.entries {
			if c.misses <= target {
				return
			}
			if e.isMiss() && (!expiredOnly || now.After(e.freshUntil)) {
				delete(c.entries, name)
				c.misses--
			}
		}
	}
}
