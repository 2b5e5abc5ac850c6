// Package migrations holds the schema as SQL files, embedded in the binary and applied
// by goose (see cmd/certworker migrate).
//
// Numbered files hold tables, columns, indexes, constraints, trigger attachments and
// one-time data moves, and a change is a new file. The current definition of every
// certworker function is in functions/NAME.sql instead, applied after them on every
// migrate when it differs from the catalogue's (functions.go, docs/database-functions.md). Every change is additive, because the proxy reads and writes the same tables and is deployed on its own
// schedule, and because the previous release's binary runs on the schema too (the
// compatibility window, release.go): a removal waits a release, in a contract step. Every file is online-safe and idempotent, because Up runs a migration
// again from its first statement when one gave up waiting for a lock, and because a
// migrate that was interrupted is finished by the next: `-- +goose NO TRANSACTION`
// where a statement must run outside a transaction (CREATE INDEX CONCURRENTLY),
// IF NOT EXISTS and catalogue checks, constraints added NOT VALID and then validated,
// and DO blocks for statements that must take effect together. 00001 and 00002 were
// made so after their release, for the proxy's live database (internal/legacydb),
// before any production database had run
// them; what they leave behind is unchanged, but for proxy_certificates.expires_at,
// which is nullable as the reference had it (00006 drops NOT NULL where the old 00001
// set it).
//
// # SECURITY DEFINER functions
//
// A definer function runs with the rights of the role that ran migrate, for every role
// that calls it or fires its trigger, the proxy's included; and every role may create
// temporary tables, which PostgreSQL looks up FIRST unless the search_path names
// pg_temp. So every definer function (00009 set the rule):
//
//   - is created with SET search_path = public, pg_temp: pg_temp named, and last;
//   - writes every table, sequence and certworker function it touches as public.x,
//     and a built-in whose argument is an untyped literal of a non-text parameter as
//     pg_catalog.f (pg_catalog.nextval('public.seq')): on PostgreSQL 13 and 14 every
//     role may create functions in public, and a text overload planted there wins
//     over the built-in for an untyped literal;
//   - is followed by REVOKE ALL ON FUNCTION public.f(...) FROM PUBLIC. A trigger
//     still fires it for any writer (EXECUTE is checked when a trigger is created, not
//     when it fires), and a definer function may call another: it runs as the owner.
//
// CREATE OR REPLACE FUNCTION replaces the SET clause with whatever the new definition
// says (none, if it says nothing), and keeps the grants: a definer function's file in
// functions/ has the SET clause, the schema-qualified names and the REVOKE, so that
// the file is right on its own.
//
// SECURITY DEFINER only where the caller lacks the rights it needs: trigger functions,
// and helpers only they call. The tenant operations the proxy calls
// (certworker_queue_for_issuance, certworker_update_domain, and any like them) are
// SECURITY INVOKER: the proxy's role already holds the rights they use. migrate
// creates no role: roles belong to the cluster, and are the operator's.
//
// TestDefinerFunctions_FollowTheConvention checks the rule on every definer function
// in the catalogue, and TestDefinerFunctions_RunNoCodeOfTheCaller attacks each one
// through temporary tables, as a role with no grants and as the proxy's.
package migrations

import "embed"

// FS holds every migration, in goose's "NNNNN_name.sql" form, and under functions/
// the current definition of every certworker function (functions.go).
//
//go:embed *.sql functions/*.sql functions/functions.sum
var FS embed.FS
