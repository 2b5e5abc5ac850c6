package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// A --acme-profile the CA's directory does not list stops run at start, with exit 2
// naming the flag and what the CA offers, before anything is claimed or ordered.
// Guards against a fleet that starts and then fails, or holds back, every domain
// without a profile of its own.
func TestRun_AnAcmeProfileTheCADoesNotOfferStopsRun(t *testing.T) {
	t.Parallel()
	pool, dsn := pgtest.NewPool(t)
	ca := pebbletest.StartT(t, pebbletest.Options{})
	id := pgtest.Domain(t, pool, pgtest.Tenant(t, pool), "profile-flag.example")

	code, stdout, stderr := invokeWithin(t, time.Minute, "run did not stop at start: it runs with a --acme-profile the CA does not offer",
		"run", "--database-url", dsn,
		"--acme-directory", ca.DirectoryURL, "--acme-ca-bundle", ca.RootsFile,
		"--acme-profile", "bogus", "--preflight", "off", "--http01-listen", "", "--admin-listen", "")
	require.Equal(t, exitUsage, code, stderr)
	require.Empty(t, stdout)
	require.Contains(t, stderr, `certworker: --acme-profile: the CA does not offer profile "bogus"; it offers alternate, default (directory `+ca.DirectoryURL+")")
	require.Zero(t, ca.OrderRequests())
	require.Zero(t, ca.NewAccounts())
	var status string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT ssl_status FROM proxy_domains WHERE id = $1`, id).Scan(&status))
	require.Equal(t, "pending", status)
}

// A CA that cannot be asked at start does not stop run: the check says so and lets
// the worker start (the first order checks the profile). Guards against a CA that is
// down for a minute keeping the whole fleet from starting.
func TestCheckProfile_ACAThatCannotBeAskedDoesNotStopTheStart(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ca := pebbletest.StartT(t, pebbletest.Options{})
	issuer, err := acme.New(context.Background(), pool, zap.NewNop(), acme.Config{Recorder: queue.New(pool, issuing.DefaultConfig()),
		DirectoryURL: "https://" + workertest.FreeAddr(t) + "/dir", CABundle: ca.RootsFile,
		Profile: "shortlived", HTTPTimeout: 5 * time.Second,
	})
	require.NoError(t, err)
	core, logs := observer.New(zap.WarnLevel)
	require.NoError(t, checkProfile(context.Background(), issuer, zap.New(core)))
	require.Equal(t, 1, logs.FilterMessage("could not ask the CA which profiles it offers; starting anyway, and the first order checks --acme-profile").Len())
}

// `status` shows the profiles: the counts by profile and, for each domain listed, its
// own and its certificate's, in the table and in --json; `status DOMAIN` both.
func TestCLI_StatusShowsTheProfiles(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t)
	execSQL(t, dsn, `
WITH t AS (INSERT INTO proxy_tenants (name, slug, email) VALUES ('t', 't', 't@example.com') RETURNING id)
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider,
    ssl_profile, ssl_profile_refused, ssl_error)
SELECT id, 'kept.example', 'verified', 'tok', 'active', 'acme', 'bogus', 'bogus', 'profile: refused' FROM t`)
	execSQL(t, dsn, `
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at, renew_at, profile)
VALUES ('kept.example', 'pem', 'key', now() + interval '60 days', now() + interval '30 days', 'classic')`)

	code, stdout, stderr := invoke(t, "status", "--database-url", dsn)
	require.Equal(t, exitOK, code, stderr)
	require.Regexp(t, `PROFILE\s+DOMAINS\s+REFUSED BY THE CA\nbogus\s+1\s+1\n`, stdout)
	require.Regexp(t, `kept\.example\s+active\s+0\s+-\s+bogus\s+classic\s+profile: refused`, stdout)

	code, stdout, stderr = invoke(t, "status", "--json", "--database-url", dsn)
	require.Equal(t, exitOK, code, stderr)
	var o struct {
		Profiles []map[string]any `json:"profiles"`
		Domains  []map[string]any `json:"domains"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &o))
	require.Equal(t, []map[string]any{{"profile": "bogus", "domains": 1.0, "refused": 1.0}}, o.Profiles)
	require.Len(t, o.Domains, 1)
	require.Equal(t, "bogus", o.Domains[0]["ssl_profile"])
	require.Equal(t, "classic", o.Domains[0]["certificate_profile"])

	code, stdout, stderr = invoke(t, "status", "kept.example", "--database-url", dsn)
	require.Equal(t, exitOK, code, stderr)
	require.Regexp(t, `\nprofile\s+bogus\n`, stdout)
	require.Regexp(t, `\nprofile refused by the CA\s+bogus\n`, stdout)
	require.Regexp(t, `\ncertificate profile\s+classic\n`, stdout)

	code, stdout, stderr = invoke(t, "status", "--json", "kept.example", "--database-url", dsn)
	require.Equal(t, exitOK, code, stderr)
	var s struct {
		Profile     string `json:"ssl_profile"`
		Certificate struct {
			Profile string `json:"profile"`
		} `json:"certificate"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &s))
	require.Equal(t, "bogus", s.Profile)
	require.Equal(t, "classic", s.Certificate.Profile)
}
