package issuing

import (
	"context"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// DomainRef names the domain row an issuer's work is for, so log lines from steps
// given only the name still carry its id and tenant.
type DomainRef struct{ ID, TenantID string }

type domainRefKey struct{}

// WithDomainRef is ctx carrying ref, set by the worker around each call for a domain.
func WithDomainRef(ctx context.Context, ref DomainRef) context.Context {
	return context.WithValue(ctx, domainRefKey{}, ref)
}

// DomainRefOf is the DomainRef ctx carries, or the zero one.
func DomainRefOf(ctx context.Context) DomainRef {
	ref, _ := ctx.Value(domainRefKey{}).(DomainRef)
	return ref
}

// LogDomain is the fields every log line about a domain carries: the name, its row's
// id and its tenant.
func LogDomain(domain, id, tenantID string) zap.Field {
	return zap.Inline(domainFields{domain, id, tenantID})
}

// LogDomainCtx is LogDomain for a step given only the name, with ctx's DomainRef.
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
