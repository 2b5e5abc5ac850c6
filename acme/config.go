package acme

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-acme/lego/v4/certcrypto"

	"github.com/certworker/certworker/certstore/seal"
	"github.com/certworker/certworker/queue/issuing"
)

// Config is what the issuer needs from the command line. Every field maps to one
// `run` flag, and validation errors name that flag.
type Config struct {
	// Recorder is where the issuer records what the store keeps for it. Required.
	Recorder Recorder
	// DirectoryURL is the ACME directory (--acme-directory). Required, https.
	DirectoryURL string
	// Email is the account contact (--acme-email), or "".
	Email string
	// CABundle is the path of a PEM file of roots trusted for the ACME server
	// beside the system's (--acme-ca-bundle), or "".
	CABundle string
	// Profile is the ACME profile of an order whose Request names none
	// (--acme-profile): the worker's for a domain whose ssl_profile is NULL. "" is
	// the CA's default: the order names no profile.
	Profile string
	// EABKeyID and EABHMAC are the external account binding (--acme-eab-kid,
	// --acme-eab-hmac): both or neither. The HMAC key is base64url, as CAs hand
	// it out.
	EABKeyID string
	EABHMAC  string
	// KeyType is the certificates' key type (--key-type): ec256, ec384, rsa2048 or
	// rsa4096; "" is ec256.
	KeyType string
	// KeyEncryptionKeys seal private keys at rest (--key-encryption-key, read with
	// seal.ParseKeyring): the first seals, any opens; empty stores PEM.
	KeyEncryptionKeys seal.Keyring
	// HTTPTimeout bounds each request to the CA (0: DefaultHTTPTimeout). lego's
	// calls take no context, so this is also what bounds a CA that accepts the
	// connection and then says nothing.
	HTTPTimeout time.Duration
	// Preflight is the check before each order (--preflight): PreflightHTTP or
	// PreflightOff. The command line's default is http; "" here is off, so that a
	// program building a Config (a test, the demo) probes only when it says so.
	Preflight string
	// PreflightResolver is the DNS server (HOST:PORT) the preflight asks
	// (--preflight-resolver), or "" for the system's.
	PreflightResolver string
	// PreflightPort is the port the preflight probes (--preflight-port); 0 is
	// DefaultPreflightPort, where the CA validates.
	PreflightPort int
	// PreflightAllowCIDR is --preflight-allow-cidr: comma-separated ranges the
	// preflight may connect to although they are reserved (loopback, private,
	// link-local...; see ParseAllowCIDR), or "" for none.
	PreflightAllowCIDR string
	// CAAIdentities are the CA's issuer domain names for CAA checks
	// (--acme-caa-identities, ParseCAAIdentities), in place of its directory's
	// meta.caaIdentities; empty uses the directory's.
	CAAIdentities []string
	// RenewalInfoPerSecond is the fleet's budget of renewal-information requests
	// (--ari-requests-per-second), which the read right after an issuance takes a
	// token of too; 0 reads without one (a test, the demo).
	RenewalInfoPerSecond float64
	// DNS01Zone is --dns01-zone: the zone certworker answers DNS-01 values in, or ""
	// for DNS-01 off. With it, a domain whose _acme-challenge CNAME points at its
	// target (DNS01Target) is validated over DNS-01, and a wildcard can be ordered.
	// New keeps it as NormalizeDNS01Zone gives it, however it is written here.
	DNS01Zone string
	// DNSTarget is --dns-target (ParseDNSTarget), or "".
	DNSTarget string
}

// DefaultHTTPTimeout is the per-request timeout towards the CA. Let's Encrypt answers
// in well under a second; 30 s leaves room for a slow finalize without letting a hung
// CA hold one of the worker's --concurrency slots for long.
const DefaultHTTPTimeout = 30 * time.Second

// keyTypes maps --key-type to lego's key types.
var keyTypes = map[string]certcrypto.KeyType{
	"ec256":   certcrypto.EC256,
	"ec384":   certcrypto.EC384,
	"rsa2048": certcrypto.RSA2048,
	"rsa4096": certcrypto.RSA4096,
}

// ParseKeyType checks a --key-type value ("" is ec256).
func ParseKeyType(s string) (certcrypto.KeyType, error) {
	if s == "" {
		return certcrypto.EC256, nil
	}
	kt, ok := keyTypes[s]
	if !ok {
		return "", fmt.Errorf("--key-type: %q is not one of ec256, ec384, rsa2048, rsa4096", s)
	}
	return kt, nil
}

// validate checks the configuration and returns the key type and the trusted roots.
func (c *Config) validate() (certcrypto.KeyType, *x509.CertPool, error) {
	if c.DirectoryURL == "" {
		return "", nil, errors.New("--acme-directory: required")
	}
	u, err := url.Parse(c.DirectoryURL)
	if err != nil || u.Host == "" {
		return "", nil, fmt.Errorf("--acme-directory: %q is not a URL", c.DirectoryURL)
	}
	if u.Scheme != "https" {
		// RFC 8555 §6.1 requires HTTPS, and lego refuses anything else.
		return "", nil, fmt.Errorf("--acme-directory: %q must be an https URL", c.DirectoryURL)
	}
	if c.Email != "" && (!strings.Contains(c.Email, "@") || strings.ContainsAny(c.Email, " \t\r\n,")) {
		return "", nil, fmt.Errorf("--acme-email: %q is not an email address", c.Email)
	}
	if c.Profile != "" {
		if err := issuing.CheckProfileName(c.Profile); err != nil {
			return "", nil, fmt.Errorf("--acme-profile: %w", err)
		}
	}
	kt, err := ParseKeyType(c.KeyType)
	if err != nil {
		return "", nil, err
	}
	switch {
	case c.EABKeyID != "" && c.EABHMAC == "":
		return "", nil, errors.New("--acme-eab-kid is set without --acme-eab-hmac (or --acme-eab-hmac-file): an external account binding needs both")
	case c.EABKeyID == "" && c.EABHMAC != "":
		return "", nil, errors.New("--acme-eab-hmac (or --acme-eab-hmac-file) is set without --acme-eab-kid: an external account binding needs both")
	case c.EABHMAC != "":
		if _, err := decodeEABHMAC(c.EABHMAC); err != nil {
			return "", nil, errors.New("--acme-eab-hmac: not base64url (the HMAC key as the CA gave it)")
		}
	}
	if err := c.KeyEncryptionKeys.Validate(); err != nil {
		return "", nil, err
	}
	if c.HTTPTimeout < 0 {
		return "", nil, fmt.Errorf("acme HTTP timeout: %s is negative", c.HTTPTimeout)
	}
	if err := c.validatePreflight(); err != nil {
		return "", nil, err
	}
	if c.DNS01Zone, err = NormalizeDNS01Zone(c.DNS01Zone); err != nil {
		return "", nil, err
	}
	for _, id := range c.CAAIdentities {
		if !isIssuerDomainName(strings.ToLower(id)) {
			return "", nil, fmt.Errorf("CAA identities: %q is not an issuer domain name", id)
		}
	}
	roots, err := c.roots()
	if err != nil {
		return "", nil, err
	}
	return kt, roots, nil
}

// validatePreflight checks the --preflight flags.
func (c *Config) validatePreflight() error {
	switch c.Preflight {
	case "", PreflightOff, PreflightHTTP:
	default:
		return fmt.Errorf("--preflight: %q is not one of http, off", c.Preflight)
	}
	if c.PreflightResolver != "" {
		host, port, err := net.SplitHostPort(c.PreflightResolver)
		if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
			return fmt.Errorf("--preflight-resolver: %q is not HOST:PORT", c.PreflightResolver)
		}
	}
	if c.PreflightPort < 0 || c.PreflightPort > 65535 {
		return fmt.Errorf("--preflight-port: %d is not a port", c.PreflightPort)
	}
	_, err := ParseAllowCIDR(c.PreflightAllowCIDR)
	return err
}

// decodeEABHMAC accepts what lego accepts: base64url, padded or not.
func decodeEABHMAC(s string) ([]byte, error) {
	if b, err := base64.RawURLEncoding.DecodeString(s); err == nil {
		return b, nil
	}
	return base64.URLEncoding.DecodeString(s)
}

// roots is the system's pool plus --acme-ca-bundle.
func (c *Config) roots() (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if c.CABundle == "" {
		return pool, nil
	}
	pemBytes, err := os.ReadFile(c.CABundle)
	if err != nil {
		return nil, fmt.Errorf("--acme-ca-bundle: %w", err)
	}
	if !pool.AppendCertsFromPEM(pemBytes) {
		return nil, fmt.Errorf("--acme-ca-bundle: no PEM certificate in %s", c.CABundle)
	}
	return pool, nil
}

func (c *Config) httpTimeout() time.Duration {
	if c.HTTPTimeout > 0 {
		return c.HTTPTimeout
	}
	return DefaultHTTPTimeout
}

// newTransport is the connection pool every order of an Issuer shares. Each order
// wraps it (orderTransport) with its own context.
func newTransport(roots *x509.CertPool, timeout time.Duration) *http.Transport {
	return &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: (&net.Dialer{
			Timeout:   10 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: timeout,
		ExpectContinueTimeout: time.Second,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConnsPerHost:   8,
		TLSClientConfig: &tls.Config{
			RootCAs:    roots,
			MinVersion: tls.VersionTLS12,
		},
	}
}

// maxEABHMACFile bounds what ReadEABHMACFile reads: a CA's HMAC key is 32 to 64
// bytes, under 100 characters of base64url; 4 KiB refuses a path that names a
// device or a large file by mistake before it is read whole.
const maxEABHMACFile = 4 << 10

// ReadEABHMACFile reads an external account binding's HMAC key from a file
// (--acme-eab-hmac-file, --acme-fallback-eab-hmac-file; flag names it in errors):
// base64url as the CA gave it, whitespace and line breaks around it ignored. A file
// keeps the key off command lines and out of the container's configuration, as
// --key-encryption-key-file does. An empty file is an error (a secret not mounted),
// and so is a key that is not base64url. Errors name the flag and the path, never
// the file's content.
func ReadEABHMACFile(flag, path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxEABHMACFile+1))
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	name := flag + " " + path
	if len(b) > maxEABHMACFile {
		return "", fmt.Errorf("%s: larger than %d KiB, which no HMAC key is", name, maxEABHMACFile>>10)
	}
	key := strings.TrimSpace(string(b))
	if key == "" {
		return "", fmt.Errorf("%s: the file holds no key (a secret not mounted, or empty?)", name)
	}
	if _, err := decodeEABHMAC(key); err != nil {
		return "", fmt.Errorf("%s: not base64url (the HMAC key as the CA gave it)", name)
	}
	return key, nil
}

// DNSTarget is --dns-target: what tenants point their names at, a host name (for a
// CNAME) or a set of addresses. The zero value is none.
type DNSTarget struct {
	Host  string
	Addrs []netip.Addr
}

// ParseDNSTarget reads --dns-target: "" (none), a host name, or comma-separated IP
// addresses.
func ParseDNSTarget(s string) (DNSTarget, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return DNSTarget{}, nil
	}
	var t DNSTarget
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if a, err := netip.ParseAddr(part); err == nil {
			t.Addrs = append(t.Addrs, a.Unmap())
			continue
		}
		if _, err := issuing.CheckName(strings.TrimSuffix(part, ".")); err != nil || strings.Contains(s, ",") {
			return DNSTarget{}, fmt.Errorf("%q is neither a host name nor a list of IP addresses", s)
		}
		t.Host = strings.ToLower(strings.TrimSuffix(part, "."))
	}
	return t, nil
}

// String is the target as ssl_error names it.
func (t DNSTarget) String() string {
	if t.Host != "" {
		return t.Host
	}
	parts := make([]string, len(t.Addrs))
	for i, a := range t.Addrs {
		parts[i] = a.String()
	}
	return strings.Join(parts, ", ")
}

// Recorder is what the issuer records beside its own tables: the challenge each order
// chose (which status shows), and the fleet's shared budget of renewal-information
// reads. The store (package queue) implements it; the command wires it in, so that
// this package depends on the issuer contract (package issuing) and not on the store.
type Recorder interface {
	// RecordChallenge records the challenge chosen for domainID's order, and why.
	RecordChallenge(ctx context.Context, domainID, challenge, reason string) error
	// TakeRenewalInfoTokens takes up to want tokens of directory's budget of
	// perSecond reads, shared by every instance; it returns how many it got and, when
	// fewer, how long until the next.
	TakeRenewalInfoTokens(ctx context.Context, directory string, want int, perSecond float64) (got int, wait time.Duration, err error)
}
