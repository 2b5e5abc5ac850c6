package acme

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/stretchr/testify/require"
)

// The issue and issuewild grammar of RFC 8659 §4.2, read strictly: a value that does
// not fit it authorizes no CA. Guards against a lenient parser that lets a malformed
// record (the tenant's) authorize a CA it does not name, or a strict one that
// refuses the shapes real zones use (spaces, parameters, no domain).
func TestParseIssueValue(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		value  string
		ok     bool
		domain string
		params map[string]string
	}{
		{"letsencrypt.org", true, "letsencrypt.org", nil},
		{"  LetsEncrypt.ORG  ", true, "letsencrypt.org", nil},
		{"\tca.example\t", true, "ca.example", nil},
		{";", true, "", nil},
		{"", true, "", nil},
		{" ; ", true, "", nil},
		{"letsencrypt.org;", true, "letsencrypt.org", nil},
		{"letsencrypt.org; accounturi=https://acme-v02.api.letsencrypt.org/acme/acct/1",
			true, "letsencrypt.org", map[string]string{"accounturi": "https://acme-v02.api.letsencrypt.org/acme/acct/1"}},
		{"letsencrypt.org;validationmethods=http-01,dns-01 ; AccountURI = https://a/b",
			true, "letsencrypt.org", map[string]string{"validationmethods": "http-01,dns-01", "accounturi": "https://a/b"}},
		{"letsencrypt.org; policy=ev", true, "letsencrypt.org", map[string]string{"policy": "ev"}},
		{"letsencrypt.org; key=", true, "letsencrypt.org", map[string]string{"key": ""}},
		// Not the grammar.
		{"lets encrypt.org", false, "", nil},
		{"letsencrypt.org.", false, "", nil},
		{"-ca.example", false, "", nil},
		{"ca-.example", false, "", nil},
		{"ca_x.example", false, "", nil},
		{"*.ca.example", false, "", nil},
		{"letsencrypt.org; accounturi", false, "", nil},
		{"letsencrypt.org; =x", false, "", nil},
		{"letsencrypt.org; a=b;", false, "", nil},
		{"letsencrypt.org; a=b c", false, "", nil},
		{"letsencrypt.org; a=b; a=c", false, "", nil},
		{"letsencrypt.org; a=\x7f", false, "", nil},
		{"lëtsencrypt.org", false, "", nil},
	} {
		iv, ok := parseIssueValue(tc.value)
		require.Equal(t, tc.ok, ok, "%q", tc.value)
		if ok {
			require.Equal(t, tc.domain, iv.domain, "%q", tc.value)
			if tc.params == nil {
				require.Empty(t, iv.params, "%q", tc.value)
			} else {
				require.Equal(t, tc.params, iv.params, "%q", tc.value)
			}
		}
	}
}

// Who may issue, given a relevant RRset (RFC 8659 §4, RFC 8657): every case that
// decides which CA the worker asks. Guards against asking a CA the tenant's records
// forbid (a CA that checks CAA refuses, and a CA that should and does not issues
// against the tenant's wishes), and against holding back a CA they allow.
func TestDecideCAA(t *testing.T) {
	t.Parallel()
	const acct = "https://ca.example/acct/1"
	le := CAAIssuer{Identities: []string{"letsencrypt.org"}, AccountURI: acct}
	two := CAAIssuer{Identities: []string{"pebble-two.test", "two.example"}, AccountURI: "https://two.example/acct/9", Method: ValidationHTTP01}
	none := CAAIssuer{AccountURI: acct}
	rec := func(tag, value string) CAARecord { return CAARecord{Tag: tag, Value: value} }
	for _, tc := range []struct {
		name     string
		records  []CAARecord
		wildcard bool
		cas      []CAAIssuer
		allowed  []bool
		named    []string
		unknown  string
	}{
		{"no records: every CA", nil, false, []CAAIssuer{le, two, none}, []bool{true, true, true}, nil, ""},
		{"only iodef: every CA", []CAARecord{rec("iodef", "mailto:a@b.example")}, false, []CAAIssuer{le, none}, []bool{true, true}, nil, ""},
		{"issue names the first", []CAARecord{rec("issue", "letsencrypt.org")}, false, []CAAIssuer{le, two}, []bool{true, false}, []string{"letsencrypt.org"}, ""},
		{"issue names the second's other identity", []CAARecord{rec("issue", "two.example")}, false, []CAAIssuer{le, two}, []bool{false, true}, []string{"two.example"}, ""},
		{"tag and name compare without case", []CAARecord{rec("ISSUE", "LetsEncrypt.org")}, false, []CAAIssuer{le}, []bool{true}, []string{"letsencrypt.org"}, ""},
		{"two issue records: both", []CAARecord{rec("issue", "letsencrypt.org"), rec("issue", "pebble-two.test")}, false, []CAAIssuer{le, two}, []bool{true, true}, []string{"letsencrypt.org", "pebble-two.test"}, ""},
		{"issue names neither", []CAARecord{rec("issue", "sectigo.com"), rec("issue", "digicert.com")}, false, []CAAIssuer{le, two}, []bool{false, false}, []string{"sectigo.com", "digicert.com"}, ""},
		{"issue ; forbids all", []CAARecord{rec("issue", ";")}, false, []CAAIssuer{le, two}, []bool{false, false}, nil, ""},
		{"a CA without identities is forbidden by any issue", []CAARecord{rec("issue", "letsencrypt.org")}, false, []CAAIssuer{none}, []bool{false}, []string{"letsencrypt.org"}, ""},
		{"malformed issue authorizes nobody", []CAARecord{rec("issue", "letsencrypt.org; broken")}, false, []CAAIssuer{le}, []bool{false}, nil, ""},
		{"malformed beside a good one", []CAARecord{rec("issue", "letsencrypt.org; broken"), rec("issue", "pebble-two.test")}, false, []CAAIssuer{le, two}, []bool{false, true}, []string{"pebble-two.test"}, ""},
		{"accounturi ours", []CAARecord{rec("issue", "letsencrypt.org; accounturi="+acct)}, false, []CAAIssuer{le}, []bool{true}, []string{"letsencrypt.org"}, ""},
		{"accounturi another's", []CAARecord{rec("issue", "letsencrypt.org; accounturi=https://ca.example/acct/2")}, false, []CAAIssuer{le}, []bool{false}, []string{"letsencrypt.org"}, ""},
		{"accounturi with no account yet", []CAARecord{rec("issue", "letsencrypt.org; accounturi="+acct)}, false, []CAAIssuer{{Identities: []string{"letsencrypt.org"}}}, []bool{false}, []string{"letsencrypt.org"}, ""},
		{"accounturi is exact", []CAARecord{rec("issue", "letsencrypt.org; accounturi="+acct+"/")}, false, []CAAIssuer{le}, []bool{false}, []string{"letsencrypt.org"}, ""},
		{"validationmethods lists http-01", []CAARecord{rec("issue", "letsencrypt.org; validationmethods=dns-01,http-01")}, false, []CAAIssuer{le}, []bool{true}, []string{"letsencrypt.org"}, ""},
		{"validationmethods without http-01", []CAARecord{rec("issue", "letsencrypt.org; validationmethods=dns-01,tls-alpn-01")}, false, []CAAIssuer{le}, []bool{false}, []string{"letsencrypt.org"}, ""},
		{"validationmethods empty", []CAARecord{rec("issue", "letsencrypt.org; validationmethods=")}, false, []CAAIssuer{le}, []bool{false}, []string{"letsencrypt.org"}, ""},
		{"validationmethods malformed", []CAARecord{rec("issue", "letsencrypt.org; validationmethods=http-01,,dns-01")}, false, []CAAIssuer{le}, []bool{false}, []string{"letsencrypt.org"}, ""},
		{"both parameters must hold", []CAARecord{rec("issue", "letsencrypt.org; accounturi="+acct+"; validationmethods=dns-01")}, false, []CAAIssuer{le}, []bool{false}, []string{"letsencrypt.org"}, ""},
		{"a second record for the same CA can allow what the first does not", []CAARecord{
			rec("issue", "letsencrypt.org; validationmethods=dns-01"), rec("issue", "letsencrypt.org; accounturi="+acct)}, false, []CAAIssuer{le}, []bool{true}, []string{"letsencrypt.org"}, ""},
		{"unknown parameter ignored", []CAARecord{rec("issue", "letsencrypt.org; policy=ev")}, false, []CAAIssuer{le}, []bool{true}, []string{"letsencrypt.org"}, ""},
		{"issuewild does not decide a plain name", []CAARecord{rec("issue", "letsencrypt.org"), rec("issuewild", "pebble-two.test")}, false, []CAAIssuer{le, two}, []bool{true, false}, []string{"letsencrypt.org"}, ""},
		{"issuewild decides a wildcard", []CAARecord{rec("issue", "letsencrypt.org"), rec("issuewild", "pebble-two.test")}, true, []CAAIssuer{le, two}, []bool{false, true}, []string{"pebble-two.test"}, ""},
		{"issue decides a wildcard without issuewild", []CAARecord{rec("issue", "letsencrypt.org")}, true, []CAAIssuer{le, two}, []bool{true, false}, []string{"letsencrypt.org"}, ""},
		{"a wildcard is validated over dns-01: validationmethods=http-01 forbids it", []CAARecord{rec("issuewild", "letsencrypt.org; validationmethods=http-01")}, true, []CAAIssuer{le}, []bool{false}, []string{"letsencrypt.org"}, ""},
		{"a wildcard is validated over dns-01: validationmethods=dns-01 allows it", []CAARecord{rec("issuewild", "letsencrypt.org; validationmethods=dns-01")}, true, []CAAIssuer{le}, []bool{true}, []string{"letsencrypt.org"}, ""},
		{"issuewild alone leaves plain names to every CA", []CAARecord{rec("issuewild", ";")}, false, []CAAIssuer{le, two}, []bool{true, true}, nil, ""},
		{"known critical tag is fine", []CAARecord{{Flag: 128, Tag: "issue", Value: "letsencrypt.org"}, {Flag: 128, Tag: "iodef", Value: "mailto:x@y"}}, false, []CAAIssuer{le}, []bool{true}, []string{"letsencrypt.org"}, ""},
		{"unknown critical tag forbids all", []CAARecord{rec("issue", "letsencrypt.org"), {Flag: 128, Tag: "tbs", Value: "x"}}, false, []CAAIssuer{le, two}, []bool{false, false}, []string{"letsencrypt.org"}, "tbs"},
		{"unknown critical tag forbids without issue too", []CAARecord{{Flag: 128, Tag: "Future", Value: "x"}}, false, []CAAIssuer{le}, []bool{false}, nil, "future"},
		{"unknown critical tag not shown when not a tag", []CAARecord{{Flag: 129, Tag: "bad tag\n", Value: "x"}}, false, []CAAIssuer{le}, []bool{false}, nil, "(unreadable)"},
		{"unknown identities: allowed without issue", []CAARecord{rec("iodef", "mailto:a@b.example")}, false, []CAAIssuer{{Unknown: true}, le}, []bool{true, true}, nil, ""},
		{"unknown identities: not allowed with issue", []CAARecord{rec("issue", "letsencrypt.org")}, false, []CAAIssuer{{Unknown: true}, le}, []bool{false, true}, []string{"letsencrypt.org"}, ""},
		{"unknown tag without the flag is ignored", []CAARecord{rec("future", "x"), {Flag: 1, Tag: "other", Value: "y"}}, false, []CAAIssuer{le}, []bool{true}, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v := decideCAA("shop.example", CAASet{Domain: "example", Records: tc.records}, tc.wildcard, tc.cas)
			require.Equal(t, tc.allowed, v.Allowed)
			require.Equal(t, tc.named, v.Named)
			require.Equal(t, tc.unknown, v.CriticalTag)
		})
	}
}

// A verdict that forbids every CA is a permanent failure whose message, the
// tenant's ssl_error, starts with caa: and names what the records allow, but not
// what does not fit the grammar (the records are the tenant's). Guards against a
// refusal that retries forever, or one that puts the tenant's garbage in ssl_error.
func TestCAAVerdict_ErrNamesTheAllowedCAs(t *testing.T) {
	t.Parallel()
	rec := func(v string) CAARecord { return CAARecord{Tag: "issue", Value: v} }
	le := CAAIssuer{Identities: []string{"letsencrypt.org"}}
	v := decideCAA("a.shop.example", CAASet{Domain: "shop.example", Records: []CAARecord{
		rec("sectigo.com"), rec("digicert.com; accounturi=x"), rec("<script>.example"), rec("sectigo.com"),
	}}, false, []CAAIssuer{le})
	err := v.Err()
	var pe *issuing.PermanentError
	require.True(t, errors.As(err, &pe), "%v", err)
	var ce *CAAError
	require.True(t, errors.As(err, &ce))
	require.True(t, ce.Forbidden)
	require.Equal(t, "caa: the CAA records of a.shop.example (found at shop.example) allow only sectigo.com, digicert.com, "+
		"not the CAs certworker orders from (or not with their account or validation method http-01)", err.Error())

	v = decideCAA("shop.example", CAASet{Domain: "shop.example", Records: []CAARecord{rec(";")}}, false, []CAAIssuer{le})
	require.EqualError(t, v.Err(), "caa: the CAA records of shop.example allow no CA to issue")

	// A CA whose identities cannot be read is undecided, not refused: the domain is
	// held back uncharged, never failed for good, while its directory is down.
	v = decideCAA("shop.example", CAASet{Domain: "shop.example", Records: []CAARecord{rec("letsencrypt.org")}}, false,
		[]CAAIssuer{{Unknown: true}, {Identities: []string{"pki.goog"}}})
	require.Equal(t, []bool{true, false}, v.Undecided)
	var cu *issuing.CAUnavailableError
	require.True(t, errors.As(v.Err(), &cu), "%v", v.Err())
	require.False(t, errors.As(v.Err(), &pe))
	v = decideCAA("shop.example", CAASet{Domain: "shop.example", Records: []CAARecord{{Flag: 128, Tag: "x", Value: ""}}}, false,
		[]CAAIssuer{{Unknown: true}})
	require.Equal(t, []bool{false}, v.Undecided, "an unknown critical tag forbids every CA, known or not")
	require.True(t, errors.As(v.Err(), &pe))

	allowed := decideCAA("shop.example", CAASet{}, false, []CAAIssuer{le})
	require.NoError(t, allowed.Err())
	require.True(t, allowed.AnyAllowed())
}

// The identities flags: comma-separated issuer domain names. Guards against a typo
// (a URL, a space inside) that would make every CAA record forbid the CA.
func TestParseCAAIdentities(t *testing.T) {
	t.Parallel()
	ids, err := ParseCAAIdentities("--acme-caa-identities", " LetsEncrypt.org , pki.goog., letsencrypt.org")
	require.NoError(t, err)
	require.Equal(t, []string{"letsencrypt.org", "pki.goog"}, ids)
	ids, err = ParseCAAIdentities("--acme-caa-identities", "  ")
	require.NoError(t, err)
	require.Nil(t, ids)
	for _, bad := range []string{"https://letsencrypt.org", "lets encrypt.org", "a,,b", "-x.org"} {
		_, err := ParseCAAIdentities("--acme-fallback-caa-identities", bad)
		require.ErrorContains(t, err, "--acme-fallback-caa-identities: ", bad)
	}
}

// A resolver that does not answer within the query's time is a failed look-up, a
// *CAAError saying it timed out, not "no records": the issue counts a CAA timeout as
// the tenant's DNS, charged like a failed preflight. Guards against a silent DNS
// being read as permission for every CA.
func TestCheckCAA_TimeoutIsALookupError(t *testing.T) {
	t.Parallel()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = pc.Close() })
	// Nothing reads pc: every query goes unanswered (and TCP is refused).
	r, err := NewCAAResolver(pc.LocalAddr().String())
	require.NoError(t, err)
	r.queryTimeout = 200 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = CheckCAA(ctx, r, "shop.example", CAAIssuer{Identities: []string{"letsencrypt.org"}})
	var ce *CAAError
	require.True(t, errors.As(err, &ce), "%v", err)
	require.False(t, ce.Forbidden)
	require.Equal(t, "caa: the DNS look-up of the CAA records of shop.example timed out", err.Error())
	require.NotContains(t, err.Error(), pc.LocalAddr().String(), "the resolver's address is the operator's")

	// The whole climb is bounded too.
	r.queryTimeout, r.total = time.Second, 300*time.Millisecond
	_, err = CheckCAA(ctx, r, "a.b.c.shop.example", CAAIssuer{})
	require.True(t, errors.As(err, &ce), "%v", err)
	require.Contains(t, err.Error(), "timed out")
}
