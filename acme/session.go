package acme

import (
	"encoding/json"
	"net/http"
	"net/url"
	"sync"
	"time"

	legoacme "github.com/go-acme/lego/v4/acme"
)

const (
	// directoryTTL is how long a fetched directory serves every order. A CA
	// changes its directory when it adds an endpoint, announced months ahead; an
	// hour bounds how late an Issuer sees such a change, at one request an hour.
	directoryTTL = time.Hour

	// nonceMaxAge is how long an unused nonce is kept for another order. Boulder
	// forgets a nonce once its nonce service has handed out 65,536 newer ones
	// (nonce.go, defaultMaxUsed), which at Let's Encrypt's volume is a matter of
	// seconds to minutes. An older nonce is likely to be refused (badNonce, which
	// lego retries at the cost of one request, as much as fetching a fresh one).
	nonceMaxAge = 30 * time.Second

	// maxPooledNonces bounds the pool. Every answer of the CA carries a nonce and
	// every signed request uses one, so a handful covers --concurrency orders;
	// the newest are kept.
	maxPooledNonces = 32
)

// session is what every order of an Issuer shares with its CA: the directory, and
// the nonces the CA handed out that no request has used yet. Orders still have
// their own lego client and HTTP transport (each carries its order's context, which
// is what cancels an order: lego's calls take none); their transports answer the
// directory and new-nonce requests from here, so the CA sees only the requests an
// order needs. Safe for concurrent use.
type session struct {
	directoryURL string
	origin       *url.URL // the directory's scheme and host

	// fetching is held by the one caller that fetches the directory for the
	// renewal-information reads while the session has none fresh: the worker asks
	// about many certificates at once, and each would otherwise fetch it too.
	fetching chan struct{}

	mu          sync.Mutex // guards the fields below
	directory   []byte     // the directory's JSON, or nil
	fetched     time.Time
	newNonce    string // the directory's newNonce URL
	newOrder    string // the directory's newOrder URL
	renewalInfo string // the directory's renewalInfo URL, "" when the CA offers none
	nonces      []pooledNonce
}

type pooledNonce struct {
	value string
	at    time.Time
}

func newSession(directoryURL string) *session {
	origin, err := url.Parse(directoryURL)
	if err != nil {
		// Config.validate has parsed it already.
		origin = &url.URL{}
	}
	return &session{directoryURL: directoryURL, origin: origin, fetching: make(chan struct{}, 1)}
}

// isDirectory reports whether req fetches the directory.
func (s *session) isDirectory(req *http.Request) bool {
	return req.Method == http.MethodGet && req.URL.String() == s.directoryURL
}

// isNewNonce reports whether req asks the CA for a fresh nonce (RFC 8555 §7.2).
func (s *session) isNewNonce(req *http.Request) bool {
	if req.Method != http.MethodHead && req.Method != http.MethodGet {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.newNonce != "" && req.URL.String() == s.newNonce
}

// isNewOrder reports whether req places an order.
func (s *session) isNewOrder(req *http.Request) bool {
	if req.Method != http.MethodPost {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.newOrder != "" && req.URL.String() == s.newOrder
}

// cachedDirectory is the directory's JSON while it is fresh.
func (s *session) cachedDirectory(now time.Time) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.directory == nil || now.Sub(s.fetched) > directoryTTL {
		return nil, false
	}
	return s.directory, true
}

// cachedRenewalInfo is the directory's renewalInfo URL ("" when the CA offers none)
// while the directory is fresh; ok is false when there is none fresh.
func (s *session) cachedRenewalInfo(now time.Time) (url string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.directory == nil || now.Sub(s.fetched) > directoryTTL {
		return "", false
	}
	return s.renewalInfo, true
}

// keepDirectory stores a directory the CA served, if it is one.
func (s *session) keepDirectory(body []byte, now time.Time) {
	var dir legoacme.Directory
	if json.Unmarshal(body, &dir) != nil || dir.NewNonceURL == "" || dir.NewOrderURL == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.directory, s.fetched = body, now
	s.newNonce, s.newOrder, s.renewalInfo = dir.NewNonceURL, dir.NewOrderURL, dir.RenewalInfo
}

// lastDirectory is the last directory the CA served, however old; ok is false when
// it never served one.
func (s *session) lastDirectory() (dir legoacme.Directory, ok bool) {
	s.mu.Lock()
	body := s.directory
	s.mu.Unlock()
	if body == nil || json.Unmarshal(body, &dir) != nil {
		return legoacme.Directory{}, false
	}
	return dir, true
}

// pushNonce keeps a nonce the CA handed out.
func (s *session) pushNonce(nonce string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nonces = append(s.nonces, pooledNonce{value: nonce, at: now})
	if n := len(s.nonces); n > maxPooledNonces {
		s.nonces = append(s.nonces[:0], s.nonces[n-maxPooledNonces:]...)
	}
}

// popNonce takes the newest nonce young enough to be accepted; each is handed out
// once.
func (s *session) popNonce(now time.Time) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.nonces) > 0 {
		n := s.nonces[len(s.nonces)-1]
		s.nonces = s.nonces[:len(s.nonces)-1]
		if now.Sub(n.at) <= nonceMaxAge {
			return n.value, true
		}
	}
	return "", false
}

// sameOrigin reports whether u is on the CA's host: only the CA's nonces are
// pooled.
func (s *session) sameOrigin(u *url.URL) bool {
	return s.origin.Scheme == u.Scheme && s.origin.Host == u.Host
}
