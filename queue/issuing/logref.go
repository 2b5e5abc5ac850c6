package issuing

import (
	"context"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// DomainRef names the domain row an issuer's work is for, so that every log line
// about a domain carries its row's id and its tenant beside the name, also from
// steps that are given only the name (the preflight, the challenge's choice).
type DomainRef struct{ ID, TenantID string }

type domainRefKey struct{}

// WithDomainRef is ctx carrying ref; the worker sets it around each call of an
// Issuer or a DNSChecker for one domain.
func WithDomainRef(ctx context.Context, ref DomainRef) context.Context {
	return context.WithValue(ctx, domainRefKey{}, ref)
}

// DomainRefOf is the DomainRef ctx carries, or the zero one.
func DomainRefOf(ctx context.Context) DomainRef {
	ref, _ := ctx.Value(domainRefKey{}).(DomainRef)
	return ref
}

// LogDomain is the fields every log line about a domain carries: the name as given,
// its row's id and its tenant, so that an operator can follow one tenant's lines and
// trace a line to its row whatever the name's spelling.
func LogDomain(domain, id, tenantID string) zap.Field {
	return zap.Inline(domainFields{domain, id, tenantID})
}

// LogDomainCtx is LogDomain for a step given only the name: the row's id and tenant
// are those ctx carries (WithDomainRef).
func LogDomainCtx(ctx context.Context, domain string) zap.Field {
	ref := DomainRefOf(ctx)
	return LogDomain(domain, ref.ID, ref.TenantID)
}

type domainFields struct{ domain, id, tenantID string }

func (f domainFields) MarshalLogObject(e zapcore.ObjectEncoder) error {
	e.AddString("domain", f.domain)
	e.AddString("domain_id", f.id)
	e.AddString("tenant_id", f.tenantID)
	return nil
}
