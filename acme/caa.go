package acme

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/miekg/dns"
	"go.uber.org/zap"
)

// CAA: which CAs a name's DNS allows to issue for it (RFC 8659), and with which
// account and validation method (RFC 8657). The worker reads a name's records once
// before it orders, and asks each CA it could send the order to only when the records
// allow that CA. Pebble checks no CAA, and Let's Encrypt checks it again at
// finalize: this check is not the CA's, it decides which CA is asked.
//
// The records are the tenant's: hostile input. Nothing of them reaches ssl_error but
// issuer domain names and property tags that fit their grammar, a few of them.

// ValidationHTTP01 is the validation method the worker's orders use: what an RFC 8657
// validationmethods parameter must list for a CA to issue for it.
const ValidationHTTP01 = "http-01"

// ValidationDNS01 is the validation method of a wildcard's orders, which DNS-01
// alone can validate (RFC 8555 §7.1.3): a wildcard's CAA check compares it with a
// validationmethods parameter whatever the CA's Method says.
const ValidationDNS01 = "dns-01"

// CAAPrefix starts the ssl_error of a domain that CAA held back.
const CAAPrefix = "caa: "

const (
	// caaTimeout bounds a whole look-up, every label of the climb and CNAME
	// included. A name has at most 127 labels, but a real one has a handful, each
	// one query; a resolver that takes longer for all of them together is a
	// resolver the CA's own look-up would likely fail on too.
	caaTimeout = 10 * time.Second

	// maxCAACNAMEHops bounds the CNAME chain followed for one name (RFC 8659 §3
	// follows aliases as DNS resolution does; a resolver gives up after a similar
	// number, and a loop must end).
	maxCAACNAMEHops = 8

	// caaUDPSize is the EDNS0 buffer size asked for: the DNS flag day 2020 value,
	// which avoids IP fragmentation; a larger answer comes truncated and is asked
	// again over TCP.
	caaUDPSize = 1232

	// maxNamedIssuers bounds how many issuer domain names a refusal's message
	// lists: the records are the tenant's, and ssl_error is read by people.
	maxNamedIssuers = 8
)

// caaFlagCritical is the issuer critical flag of a CAA record (RFC 8659 §4.1): a CA
// that does not understand the property's tag must not issue.
const caaFlagCritical = 0x80

// knownCAATags are the property tags the worker understands, enough to know they do
// not forbid issuance by HTTP-01 for a DNS name: issue and issuewild (RFC 8659),
// iodef (reports, which it does not send), contactemail and contactphone (CA/B
// Forum, for DNS-based validation methods), issuemail (RFC 9495, S/MIME) and
// issuevmc (BIMI marks). Any other tag flagged critical forbids issuance.
var knownCAATags = map[string]bool{
	"issue": true, "issuewild": true, "iodef": true, "contactemail": true,
	"contactphone": true, "issuemail": true, "issuevmc": true,
}

// errCAATimeout is the cause of a look-up that took longer than caaTimeout.
var errCAATimeout = errors.New("the CAA look-up took too long")

// CAARecord is one CAA resource record.
type CAARecord struct {
	Flag  uint8
	Tag   string
	Value string
}

// Critical reports whether the record's issuer critical flag is set.
func (r CAARecord) Critical() bool { return r.Flag&caaFlagCritical != 0 }

// CAASet is a name's relevant CAA RRset (RFC 8659 §3): the first non-empty CAA
// RRset found climbing from the name towards the root, aliases followed.
type CAASet struct {
	// Domain is where the records were found: the name, or one of its parents.
	// "" with no records: none of them has any, and every CA may issue.
	Domain  string
	Records []CAARecord
}

// CAAIssuer is what a CA's CAA check needs to know of it.
type CAAIssuer struct {
	// Identities are the CA's issuer domain names: --acme-caa-identities, or its
	// directory's meta.caaIdentities. A CA with none matches no issue property, so
	// records with one forbid it.
	Identities []string
	// AccountURI is the account the worker orders with at this CA, compared with an
	// accounturi parameter (RFC 8657 §3); "" when none is registered yet, which no
	// such parameter names.
	AccountURI string
	// Method is the validation method of the worker's orders; "" is
	// ValidationHTTP01. Compared with a validationmethods parameter (RFC 8657 §4).
	Method string
	// Unknown: the CA's identities or account could not be read (its directory
	// cannot be fetched and none was fetched before, the database did not answer).
	// Records without an issue property still allow it; records with one leave it
	// Undecided, never refused.
	Unknown bool
}

// CAAVerdict is what a name's CAA records say of the CAs it was checked for.
type CAAVerdict struct {
	// Name is the name checked, in lower case, without a trailing dot.
	Name string
	// Set is the relevant RRset.
	Set CAASet
	// Allowed says, for each CA in the order they were given, whether the records
	// allow it to issue.
	Allowed []bool
	// Named are the issuer domain names the relevant issue (or issuewild)
	// properties name, lower case, deduplicated: the CAs the records allow, as far
	// as their parameters go. Empty with records that allow every CA (no issue
	// property) and with records that allow none (issue ";").
	Named []string
	// CriticalTag is the tag of a property flagged critical that the worker does
	// not understand, which forbids every CA; "" when there is none.
	CriticalTag string
	// Undecided says, for each CA, that the records have an issue property and the
	// CA's identities are not known (CAAIssuer.Unknown): it is not allowed, and not
	// refused either.
	Undecided []bool
}

// AnyAllowed reports whether at least one of the CAs may issue.
func (v CAAVerdict) AnyAllowed() bool { return slices.Contains(v.Allowed, true) }

// Err is nil when a CA may issue. When none may and one is Undecided, it is a
// *issuing.CAUnavailableError (not charged: the CA's directory could not be read, which
// says nothing of the name). Otherwise it is a *issuing.PermanentError holding a
// *CAAError that says which CAs the records allow: no retry helps until the tenant
// changes the records (then `certworker retry`).
func (v CAAVerdict) Err() error {
	if v.AnyAllowed() {
		return nil
	}
	if slices.Contains(v.Undecided, true) {
		return &issuing.CAUnavailableError{Err: &CAAError{Msg: fmt.Sprintf(
			"the CAA records of %s name CAs, and the identities of a CA certworker orders from cannot be read now (its directory does not answer)", v.Name)}}
	}
	return &issuing.PermanentError{Err: &CAAError{Forbidden: true, Msg: v.refusal()}}
}

// refusal is the message of a verdict that allows none of the CAs.
func (v CAAVerdict) refusal() string {
	at := v.Set.Domain
	where := "the CAA records of " + v.Name
	if at != "" && at != v.Name {
		where += " (found at " + at + ")"
	}
	switch {
	case v.CriticalTag != "":
		return fmt.Sprintf("%s hold a critical property %q that certworker does not understand, which allows no CA to issue", where, v.CriticalTag)
	case len(v.Named) == 0:
		return where + " allow no CA to issue"
	}
	named := v.Named
	more := ""
	if len(named) > maxNamedIssuers {
		named, more = named[:maxNamedIssuers], fmt.Sprintf(" and %d more", len(v.Named)-maxNamedIssuers)
	}
	return fmt.Sprintf("%s allow only %s%s, not the CAs certworker orders from (or not with their account or validation method %s)",
		where, strings.Join(named, ", "), more, ValidationHTTP01)
}

// CAAError is a CAA check that holds a name back. Its message is fit for the
// tenant's ssl_error: it names the domain, the DNS's answer code and the issuer
// domain names of the records, never the resolver's address.
type CAAError struct {
	Msg string
	// Forbidden: the records forbid every CA asked about (CAAVerdict.Err, wrapped in
	// a *issuing.PermanentError). Otherwise the look-up failed (SERVFAIL, REFUSED, no
	// answer in time): the tenant's DNS, charged like a failed preflight (As) and
	// retried with backoff.
	Forbidden bool
}

func (e *CAAError) Error() string { return CAAPrefix + e.Msg }

// As makes a failed look-up a *issuing.PreflightError to errors.As, so that the worker
// treats it as it treats a failed preflight (charged and retried, and saying nothing
// of whether the CA can be reached, which was not asked), while the message it
// records, the error's own, keeps starting with "caa: ". A refusal (Forbidden) is
// not one.
func (e *CAAError) As(target any) bool {
	if p, ok := target.(**issuing.PreflightError); ok && !e.Forbidden {
		*p = &issuing.PreflightError{Msg: e.Error()}
		return true
	}
	return false
}

// CAAResolver reads CAA records through one DNS server: the preflight's
// (--preflight-resolver), or the system's. Safe for concurrent use.
type CAAResolver struct {
	servers []string
	// queryTimeout bounds one query (dnsTimeout); total bounds a look-up
	// (caaTimeout). Fields for tests.
	queryTimeout time.Duration
	total        time.Duration
}

// NewCAAResolver asks server (HOST:PORT, --preflight-resolver) or, when it is "",
// the name servers of /etc/resolv.conf, in their order.
func NewCAAResolver(server string) (*CAAResolver, error) {
	r := &CAAResolver{queryTimeout: dnsTimeout, total: caaTimeout}
	if server != "" {
		if _, _, err := net.SplitHostPort(server); err != nil {
			return nil, fmt.Errorf("--preflight-resolver: %q is not HOST:PORT", server)
		}
		r.servers = []string{server}
		return r, nil
	}
	conf, err := dns.ClientConfigFromFile("/etc/resolv.conf")
	if err != nil {
		return nil, fmt.Errorf("acme: CAA: read the system's resolvers: %w", err)
	}
	for _, s := range conf.Servers {
		r.servers = append(r.servers, net.JoinHostPort(s, conf.Port))
	}
	if len(r.servers) == 0 {
		return nil, errors.New("acme: CAA: /etc/resolv.conf names no name server; set --preflight-resolver")
	}
	return r, nil
}

// CheckCAA reads name's CAA records and decides, for each CA of cas, whether they
// allow it to issue for name with the worker's validation method. name is the
// tenant's: a wildcard (*.example.com) is checked against issuewild as RFC 8659 §4.3
// says; an IP address has no CAA and every CA may issue.
//
// The error is a *CAAError when the look-up failed (the tenant's DNS: charge it and
// retry), and ctx's when ctx ended first. Records that forbid every CA are not an
// error here: CAAVerdict.Err says so, for the caller that has no other CA to ask.
func CheckCAA(ctx context.Context, r *CAAResolver, name string, cas ...CAAIssuer) (CAAVerdict, error) {
	name = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(name)), ".")
	v := CAAVerdict{Name: name, Allowed: make([]bool, len(cas)), Undecided: make([]bool, len(cas))}
	if _, err := netip.ParseAddr(name); err == nil {
		for i := range v.Allowed {
			v.Allowed[i] = true
		}
		return v, nil
	}
	base, wildcard := strings.CutPrefix(name, "*.")
	if !isHostName(base) {
		return v, &CAAError{Msg: "not a DNS name whose CAA records can be read"}
	}
	set, err := r.Relevant(ctx, base)
	if err != nil {
		return v, err
	}
	return decideCAA(name, set, wildcard, cas), nil
}

// decideCAA is CheckCAA's verdict once the relevant RRset is known.
func decideCAA(name string, set CAASet, wildcard bool, cas []CAAIssuer) CAAVerdict {
	v := CAAVerdict{Name: name, Set: set, Allowed: make([]bool, len(cas)), Undecided: make([]bool, len(cas))}
	if wildcard {
		cas = slices.Clone(cas)
		for i := range cas {
			cas[i].Method = ValidationDNS01
		}
	}
	v.CriticalTag = unknownCritical(set.Records)
	v.Named = namedIssuers(set.Records, wildcard)
	decides := len(propertiesFor(set.Records, wildcard)) > 0
	for i, ca := range cas {
		switch {
		case v.CriticalTag != "":
		case ca.Unknown && decides:
			v.Undecided[i] = true
		default:
			v.Allowed[i] = permits(set.Records, ca, wildcard)
		}
	}
	return v
}

// Relevant finds name's relevant CAA RRset (RFC 8659 §3): the CAA RRset of name,
// else of its parent, and so on up to, not including, the root. A name that is an
// alias has the RRset its target has (the resolver follows the CNAME, and so does
// Relevant when the resolver's answer stops at one); the climb goes on from the
// alias's parent, not the target's. A name that does not exist (NXDOMAIN) has an
// empty RRset and the climb goes on. Any other failure ends it with a *CAAError.
func (r *CAAResolver) Relevant(ctx context.Context, name string) (CAASet, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, r.total, errCAATimeout)
	defer cancel()
	labels := dns.SplitDomainName(name)
	for i := range labels {
		domain := strings.Join(labels[i:], ".")
		records, err := r.lookup(ctx, name, domain)
		if err != nil {
			return CAASet{}, err
		}
		if len(records) > 0 {
			return CAASet{Domain: domain, Records: records}, nil
		}
	}
	return CAASet{}, nil
}

// lookup is the CAA RRset of domain, CNAMEs followed. name is the name checked,
// for messages.
func (r *CAAResolver) lookup(ctx context.Context, name, domain string) ([]CAARecord, error) {
	owner := dns.Fqdn(domain)
	for range maxCAACNAMEHops {
		msg, err := r.query(ctx, name, owner)
		if err != nil {
			return nil, err
		}
		switch msg.Rcode {
		case dns.RcodeSuccess:
		case dns.RcodeNameError:
			return nil, nil
		default:
			return nil, &CAAError{Msg: fmt.Sprintf("the DNS look-up of the CAA records of %s failed: %s",
				strings.TrimSuffix(owner, "."), rcodeName(msg.Rcode))}
		}
		records, target := answerCAA(msg, owner)
		if len(records) > 0 || target == "" {
			return records, nil
		}
		// The answer stopped at an alias whose target it did not resolve.
		owner = target
	}
	return nil, &CAAError{Msg: fmt.Sprintf("the CAA look-up of %s follows more than %d aliases (CNAME)", domain, maxCAACNAMEHops)}
}

// answerCAA reads the CAA records of owner from an answer, following the CNAME
// chain the answer holds from owner. target is where the chain ends when it holds no
// CAA record for it, or "" when it ends at owner itself (no alias).
func answerCAA(msg *dns.Msg, owner string) (records []CAARecord, target string) {
	current := owner
	for range maxCAACNAMEHops + 1 {
		var next string
		for _, rr := range msg.Answer {
			if !strings.EqualFold(rr.Header().Name, current) {
				continue
			}
			switch rr := rr.(type) {
			case *dns.CAA:
				records = append(records, CAARecord{Flag: rr.Flag, Tag: rr.Tag, Value: rr.Value})
			case *dns.CNAME:
				next = rr.Target
			}
		}
		if len(records) > 0 || next == "" {
			break
		}
		current = next
	}
	if len(records) > 0 || strings.EqualFold(current, owner) {
		return records, ""
	}
	return nil, current
}

// query asks each server in turn for owner's CAA records, over UDP and again over
// TCP when the answer is truncated. The first answer is taken, whatever its code.
func (r *CAAResolver) query(ctx context.Context, name, owner string) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(owner, dns.TypeCAA)
	m.RecursionDesired = true
	m.SetEdns0(caaUDPSize, false)
	var lastErr error
	for _, server := range r.servers {
		for _, network := range []string{"udp", "tcp"} {
			qctx, cancel := context.WithTimeout(ctx, r.queryTimeout)
			// Timeout set: without it miekg/dns reads for its own 2 s default.
			c := &dns.Client{Net: network, UDPSize: caaUDPSize, Timeout: r.queryTimeout}
			in, _, err := c.ExchangeContext(qctx, m, server)
			cancel()
			if err != nil {
				lastErr = err
				break
			}
			if in.Truncated && network == "udp" {
				continue
			}
			return in, nil
		}
		if ctx.Err() != nil {
			break
		}
	}
	if ctx.Err() != nil && !errors.Is(context.Cause(ctx), errCAATimeout) {
		// Given up by the caller (the order's end), not timed out here: no verdict
		// on the name.
		return nil, fmt.Errorf("acme: CAA look-up of %s: %w", name, context.Cause(ctx))
	}
	var nerr net.Error
	if errors.As(lastErr, &nerr) && nerr.Timeout() || ctx.Err() != nil {
		return nil, &CAAError{Msg: fmt.Sprintf("the DNS look-up of the CAA records of %s timed out", strings.TrimSuffix(owner, "."))}
	}
	// The error names the resolver's address, which is the operator's.
	return nil, &CAAError{Msg: fmt.Sprintf("the DNS look-up of the CAA records of %s got no answer", strings.TrimSuffix(owner, "."))}
}

// rcodeName is the DNS answer code's name (SERVFAIL, REFUSED...).
func rcodeName(rcode int) string {
	if s, ok := dns.RcodeToString[rcode]; ok {
		return s
	}
	return fmt.Sprintf("RCODE %d", rcode)
}

// unknownCritical is the tag of the first record flagged critical whose tag the
// worker does not understand, shown only if it has a tag's shape; "" when none.
func unknownCritical(records []CAARecord) string {
	for _, rec := range records {
		tag := strings.ToLower(rec.Tag)
		if rec.Critical() && !knownCAATags[tag] {
			if len(tag) > 15 || !isCAATag(tag) {
				return "(unreadable)"
			}
			return tag
		}
	}
	return ""
}

// propertiesFor are the records that decide issuance for a name: issuewild's for a
// wildcard when there is one, issue's otherwise (RFC 8659 §4.2, §4.3). Tags compare
// without case (§4.1).
func propertiesFor(records []CAARecord, wildcard bool) []CAARecord {
	var issue, wild []CAARecord
	for _, rec := range records {
		switch strings.ToLower(rec.Tag) {
		case "issue":
			issue = append(issue, rec)
		case "issuewild":
			wild = append(wild, rec)
		}
	}
	if wildcard && len(wild) > 0 {
		return wild
	}
	return issue
}

// permits reports whether the relevant records allow ca (critical properties
// aside): no property that decides allows every CA; otherwise one must name one of
// ca's identities, with parameters ca meets.
func permits(records []CAARecord, ca CAAIssuer, wildcard bool) bool {
	props := propertiesFor(records, wildcard)
	if len(props) == 0 {
		return true
	}
	method := ca.Method
	if method == "" {
		method = ValidationHTTP01
	}
	for _, p := range props {
		iv, ok := parseIssueValue(p.Value)
		if !ok || iv.domain == "" || !slices.ContainsFunc(ca.Identities, func(id string) bool {
			return strings.EqualFold(strings.TrimSuffix(strings.TrimSpace(id), "."), iv.domain)
		}) {
			continue
		}
		if uri, set := iv.params["accounturi"]; set && (ca.AccountURI == "" || uri != ca.AccountURI) {
			continue
		}
		if methods, set := iv.params["validationmethods"]; set {
			list, ok := parseValidationMethods(methods)
			if !ok || !slices.Contains(list, method) {
				continue
			}
		}
		return true
	}
	return false
}

// namedIssuers are the issuer domain names the deciding properties name, for a
// refusal's message: only well-formed ones, which are labels of letters, digits and
// hyphens.
func namedIssuers(records []CAARecord, wildcard bool) []string {
	var out []string
	for _, p := range propertiesFor(records, wildcard) {
		if iv, ok := parseIssueValue(p.Value); ok && iv.domain != "" && !slices.Contains(out, iv.domain) {
			out = append(out, iv.domain)
		}
	}
	return out
}

// issueValue is a parsed issue or issuewild property value.
type issueValue struct {
	// domain is the issuer domain name in lower case; "" allows no CA.
	domain string
	// params are the parameters by tag in lower case.
	params map[string]string
}

// parseIssueValue parses an issue or issuewild value by RFC 8659 §4.2's grammar:
//
//	issue-value = *WSP [issuer-domain-name *WSP] [";" *WSP [parameters *WSP]]
//	issuer-domain-name = label *("." label)
//	parameters = (parameter *WSP ";" *WSP parameters) / parameter
//	parameter = tag *WSP "=" *WSP value
//	value = *(%x21-3A / %x3C-7E)
//
// ok is false for a value that does not fit it, which then allows no CA (§4.2: such
// a property is not a valid authorization); and for a parameter given twice, which
// could be read either way.
func parseIssueValue(v string) (issueValue, bool) {
	domainPart, rest, hasParams := strings.Cut(v, ";")
	iv := issueValue{domain: strings.ToLower(trimWSP(domainPart))}
	if iv.domain != "" && !isIssuerDomainName(iv.domain) {
		return issueValue{}, false
	}
	rest = trimWSP(rest)
	if !hasParams || rest == "" {
		return iv, true
	}
	iv.params = map[string]string{}
	for _, p := range strings.Split(rest, ";") {
		tag, value, ok := strings.Cut(trimWSP(p), "=")
		if !ok {
			return issueValue{}, false
		}
		tag, value = strings.ToLower(trimWSP(tag)), trimWSP(value)
		if !isCAATag(tag) || !isParamValue(value) {
			return issueValue{}, false
		}
		if _, dup := iv.params[tag]; dup {
			return issueValue{}, false
		}
		iv.params[tag] = value
	}
	return iv, true
}

// parseValidationMethods parses an RFC 8657 §4 validationmethods value: labels
// (letters, digits, inner hyphens) separated by commas, with nothing else.
func parseValidationMethods(v string) ([]string, bool) {
	if v == "" {
		return nil, true
	}
	methods := strings.Split(v, ",")
	for _, m := range methods {
		if !isCAATag(strings.ToLower(m)) {
			return nil, false
		}
	}
	return methods, true
}

// isHostName reports whether s is a DNS name of letters, digits, hyphens and
// underscores, in lower case, that fits in a query: what the worker may put in one.
func isHostName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for l := range strings.SplitSeq(s, ".") {
		if l == "" || len(l) > 63 {
			return false
		}
		for _, c := range []byte(l) {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// trimWSP trims RFC 5234 WSP (space and tab).
func trimWSP(s string) string { return strings.Trim(s, " \t") }

// isIssuerDomainName reports whether s is label *("." label).
func isIssuerDomainName(s string) bool {
	if len(s) > 253 {
		return false
	}
	for l := range strings.SplitSeq(s, ".") {
		if !isCAATag(l) {
			return false
		}
	}
	return true
}

// isCAATag reports whether s is a label as RFC 8659 defines it (and a tag, a
// parameter tag, a validation method): (ALPHA / DIGIT) *( *("-") (ALPHA / DIGIT)),
// here in lower case.
func isCAATag(s string) bool {
	if s == "" || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// isParamValue reports whether s is a parameter value: printable ASCII without
// space or semicolon.
func isParamValue(s string) bool {
	for _, c := range []byte(s) {
		if c < 0x21 || c > 0x7e || c == ';' {
			return false
		}
	}
	return true
}

// ParseCAAIdentities reads a comma-separated list of issuer domain names
// (--acme-caa-identities, --acme-fallback-caa-identities; flag names it in errors):
// the names a CA's CAA issue properties carry, such as letsencrypt.org. Spaces
// around a name are ignored; "" is none (the directory's meta.caaIdentities).
func ParseCAAIdentities(flag, s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var ids []string
	for p := range strings.SplitSeq(s, ",") {
		id := strings.TrimSuffix(strings.ToLower(strings.TrimSpace(p)), ".")
		if !isIssuerDomainName(id) {
			return nil, fmt.Errorf("%s: %q is not an issuer domain name (such as letsencrypt.org)", flag, strings.TrimSpace(p))
		}
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// CAAIdentities are the CA's issuer domain names: Config.CAAIdentities when set,
// else its directory's meta.caaIdentities (fetched as Profiles does, from the
// directory every order shares; while the CA does not answer, from the last directory
// it served this process, however old). A CA whose directory lists none has none, and CAA
// records with an issue property forbid it. The error is a
// *issuing.CAUnavailableError when the CA cannot be reached or answers 5xx.
func (i *Issuer) CAAIdentities(ctx context.Context) ([]string, error) {
	if len(i.cfg.CAAIdentities) > 0 {
		return slices.Clone(i.cfg.CAAIdentities), nil
	}
	dir, err := i.sharedDirectory(ctx)
	if err != nil {
		// A CA's identities change as seldom as its name: the last directory it
		// served, however old, is better than none while it is down.
		if last, ok := i.session.lastDirectory(); ok {
			return slices.Clone(last.Meta.CaaIdentities), nil
		}
		return nil, err
	}
	return slices.Clone(dir.Meta.CaaIdentities), nil
}

// CAAIssuer is this issuer's CA as CheckCAA needs it: its identities
// (CAAIdentities), the URI of the account it orders with (from memory or the
// database; "" when none is registered yet) and ValidationHTTP01 (CheckCAAFor sets
// the method a name's order will use). Errors as CAAIdentities's, or the database's.
func (i *Issuer) CAAIssuer(ctx context.Context) (CAAIssuer, error) {
	ids, err := i.CAAIdentities(ctx)
	if err != nil {
		return CAAIssuer{}, err
	}
	ca := CAAIssuer{Identities: ids, Method: ValidationHTTP01}
	i.accountMu.Lock()
	if i.account != nil && i.account.reg != nil {
		ca.AccountURI = i.account.reg.URI
	}
	i.accountMu.Unlock()
	if ca.AccountURI == "" {
		acct, err := i.loadAccount(ctx, i.pool)
		if err != nil {
			return CAAIssuer{}, err
		}
		if acct != nil && acct.reg != nil {
			ca.AccountURI = acct.reg.URI
		}
	}
	return ca, nil
}

// CheckCAAFor is CheckCAA for the CAs of issuers, in their order (the first CA,
// then the fallback): each one's identities and account from CAAIssuer, and the
// validation method the name's order will use (caaMethod: dns-01 when its DNS-01
// delegation is in place). A name not delegated yet, whose records allow a CA only
// dns-01 validation, is allowed that CA when its issuer has DNS-01: the issuer then
// has it wait for its CNAME (choose) rather than be refused. A CA whose
// identities cannot be read (its directory down since the worker started, without
// --acme-caa-identities) is CAAIssuer.Unknown: the verdict leaves it Undecided
// rather than refused, and the others are decided. Its error is CheckCAA's, or ctx's.
func CheckCAAFor(ctx context.Context, r *CAAResolver, name string, issuers ...*Issuer) (CAAVerdict, error) {
	cas := make([]CAAIssuer, len(issuers))
	for n, i := range issuers {
		ca, err := i.CAAIssuer(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return CAAVerdict{}, fmt.Errorf("acme: CAA identities of %s: %w", i.DirectoryURL(), context.Cause(ctx))
			}
			i.log.Debug("CAA: the CA's identities cannot be read; it is left undecided where a name's records name CAs",
				zap.String("directory", i.DirectoryURL()), zap.Error(err))
			ca = CAAIssuer{Unknown: true}
		}
		ca.Method = i.caaMethod(ctx, name)
		cas[n] = ca
	}
	v, err := CheckCAA(ctx, r, name, cas...)
	if err != nil {
		return v, err
	}
	for n, i := range issuers {
		if v.Allowed[n] || v.Undecided[n] || i.cfg.DNS01Zone == "" || cas[n].Method != ValidationHTTP01 {
			continue
		}
		alt := cas[n]
		alt.Method = ValidationDNS01
		v.Allowed[n] = decideCAA(v.Name, v.Set, false, []CAAIssuer{alt}).Allowed[0]
	}
	return v, nil
}

// caaMethod is the validation method of name's next order: dns-01 for a wildcard,
// and for a name whose _acme-challenge CNAME points at its target under the zone
// (as choose decides); http-01 otherwise, and when the CNAME cannot be read.
func (i *Issuer) caaMethod(ctx context.Context, name string) string {
	name = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(name), "."))
	if isWildcard(name) {
		return ValidationDNS01
	}
	if i.cfg.DNS01Zone == "" {
		return ValidationHTTP01
	}
	if got, err := i.dns.cname(ctx, challengeName(name)); err == nil && got == DNS01Target(i.cfg.DNS01Zone, name) {
		return ValidationDNS01
	}
	return ValidationHTTP01
}

// caaOnlyDNS01 reports whether domain's CAA records allow this issuer's CA only
// dns-01 validation, for a name about to be validated over HTTP-01 for want of its
// DNS-01 CNAME: it then waits for the CNAME rather than being ordered over a
// challenge the CA would refuse. false when the records cannot be read: the worker's
// CAA check has judged them already, and the CA checks them itself.
func (i *Issuer) caaOnlyDNS01(ctx context.Context, domain string) bool {
	if i.caa == nil {
		return false
	}
	ca, err := i.CAAIssuer(ctx)
	if err != nil {
		return false
	}
	set, err := i.caa.Relevant(ctx, domain)
	if err != nil {
		return false
	}
	ca.Method = ValidationHTTP01
	if v := decideCAA(domain, set, false, []CAAIssuer{ca}); v.Allowed[0] || v.CriticalTag != "" {
		return false
	}
	ca.Method = ValidationDNS01
	return decideCAA(domain, set, false, []CAAIssuer{ca}).Allowed[0]
}
