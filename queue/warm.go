package queue

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5"
)

// A new session plans the wake path's statements cold, five times each before the
// server settles (docs/internals.md, The wake path and held rows). WarmUp pays that
// when the connection is made: it prepares each statement under the name pgx's
// statement cache gives it and plans it until settled with EXPLAIN EXECUTE (planned,
// never run).

// customPlans is how many custom plans the server makes before weighing the generic
// one (plancache.c).
const customPlans = 5

type warmStatement struct {
	sql  string
	args []any
}

func (q *Queue) warmStatements(directory string) []warmStatement {
	const owner = "warm-up"
	newcomer, newcomerArgs := q.claimStatement(owner, directory, 1, 2, 2, 1)
	rest, restArgs := q.claimStatement(owner, directory, 3, math.MinInt16, math.MaxInt16, 3)
	next, nextArgs := q.nextDueStatement(directory)
	// MarkActive for a claim of nothing: planned, not run.
	const none = "00000000-0000-0000-0000-000000000000"
	now := time.Now().UTC().Truncate(time.Second)
	cert := &issuing.Certificate{ChainPEM: "-", PrivateKey: "-", NotBefore: now, NotAfter: now.Add(90 * 24 * time.Hour),
		Issuer: "-", Serial: "-", Directory: directory}
	cert.RenewAt = issuing.RenewAtFromValidity(cert.NotBefore, cert.NotAfter)
	store, storeArgs := markActiveStatement(issuing.Claim{ID: none, Token: none}, cert, cert.RenewAt, nil)
	return []warmStatement{{newcomer, newcomerArgs}, {rest, restArgs}, {next, nextArgs}, {store, storeArgs},
		{q.returnHeldStatement(directory), nil}}
}

// WarmUp prepares and plans the wake path's statements on conn, for the CA at
// directory. An optimisation: on error conn is as usable as it was.
func (q *Queue) WarmUp(ctx context.Context, conn *pgx.Conn, directory string) error {
	// The claim appears twice, with the newcomers' arguments and the rest's.
	var names []string
	calls := map[string][]string{}
	plans := map[string]int{}
	for _, st := range q.warmStatements(directory) {
		name := statementCacheName(st.sql)
		if _, ok := calls[name]; !ok {
			if _, err := conn.Prepare(ctx, name, st.sql); err != nil {
				return fmt.Errorf("warm-up: prepare: %w", err)
			}
			names = append(names, name)
		}
		call := "EXPLAIN EXECUTE " + name
		// A statement without parameters has one plan.
		plans[name] = 1
		if len(st.args) > 0 {
			args, err := sqlLiterals(st.args)
			if err != nil {
				return fmt.Errorf("warm-up: %w", err)
			}
			call += "(" + args + ")"
			plans[name] = customPlans + 1
		}
		calls[name] = append(calls[name], call)
	}
	for _, name := range names {
		for i := range plans[name] {
			if _, err := conn.Exec(ctx, calls[name][i%len(calls[name])], pgx.QueryExecModeSimpleProtocol); err != nil {
				return fmt.Errorf("warm-up: plan: %w", err)
			}
		}
	}
	return nil
}

// statementCacheName is the name pgx's statement cache prepares sql under
// (internal/stmtcache.StatementName in pgx v5); TestWarmUp fails if pgx changes it.
func statementCacheName(sql string) string {
	digest := sha256.Sum256([]byte(sql))
	return "stmtcache_" + hex.EncodeToString(digest[0:24])
}

// sqlLiterals writes args as SQL literals, for EXECUTE in the simple protocol.
func sqlLiterals(args []any) (string, error) {
	lits := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case nil:
			lits[i] = "NULL"
		case bool:
			lits[i] = strconv.FormatBool(v)
		case int:
			lits[i] = strconv.Itoa(v)
		case int64:
			lits[i] = strconv.FormatInt(v, 10)
		case float64:
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return "", fmt.Errorf("argument %d: %v has no SQL literal", i+1, v)
			}
			lits[i] = strconv.FormatFloat(v, 'g', -1, 64)
		case time.Time:
			lits[i] = "'" + v.UTC().Format(time.RFC3339Nano) + "'"
		case *time.Time:
			if lits[i] = "NULL"; v != nil {
				lits[i] = "'" + v.UTC().Format(time.RFC3339Nano) + "'"
			}
		case *float64:
			if v == nil {
				lits[i] = "NULL"
				continue
			}
			l, err := sqlLiterals([]any{*v})
			if err != nil {
				return "", fmt.Errorf("argument %d: %w", i+1, err)
			}
			lits[i] = l
		case *string:
			if v == nil {
				lits[i] = "NULL"
				continue
			}
			lits[i], _ = sqlLiterals([]any{*v})
		case string:
			lits[i] = "'" + strings.ReplaceAll(v, "'", "''") + "'"
			if strings.ContainsRune(v, '\\') {
				lits[i] = "E'" + strings.ReplaceAll(strings.ReplaceAll(v, `\`, `\\`), "'", "''") + "'"
			}
		default:
			return "", fmt.Errorf("argument %d: no SQL literal for %T", i+1, a)
		}
	}
	return strings.Join(lits, ", "), nil
}
