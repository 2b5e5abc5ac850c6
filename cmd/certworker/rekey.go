package main

import (
	"context"
	"errors"
	"fmt"
	"os/signal"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/certworker/certworker/certstore/seal"
)

type rekeyCmd struct {
	dbFlags
	keyFlags
	BatchSize int `name:"batch-size" env:"CERTWORKER_BATCH_SIZE" default:"100" group:"keys" help:"Keys re-sealed per transaction."`
}

// rekeyRounds is how many times a key that changed while rekey read it is read and
// re-sealed again. A row changes under rekey when a worker stores a renewal at that
// moment; three times in a row means something rewrites it continuously.
const rekeyRounds = 3

// refusalNames is how many unopenable keys the refusal names; the rest are counted.
const refusalNames = 5

func (c *rekeyCmd) Run(g *globals) error {
	if c.BatchSize < 1 {
		return usagef("--batch-size: must be at least 1, got %d", c.BatchSize)
	}
	keys, err := c.keyring()
	if err != nil {
		return err
	}
	if len(keys) == 0 {
		return usagef("--key-encryption-key is required (or --key-encryption-key-file): rekey re-seals every stored key with the first key of the list")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := checkRekeyPrivileges(ctx, pool); err != nil {
		var ue *usageError
		if errors.As(err, &ue) {
			return err
		}
		return &failedError{redact(err.Error(), c.DatabaseURL)}
	}
	res, err := newRekeyer(pool, keys, c.BatchSize).run(ctx)
	if err != nil {
		return &failedError{redact(err.Error(), c.DatabaseURL)}
	}
	fmt.Fprintln(g.stdout, res.summary(keys.SealingKeyID()))
	return nil
}

// keyTable is a table holding sealed keys, as rekey reads and writes it. Every
// statement names a row by a text key and gives the AAD its key is bound to.
type keyTable struct {
	what string
	// table and reads: the table, and every column the statements below read; the
	// privilege check asks for SELECT on these and UPDATE on private_key_pem.
	table string
	reads []string
	// page: ($1 the last key read, or NULL; $2 a limit) → key, aad, stored, in key
	// order.
	page string
	// byKeys: ($1 keys) → key, aad, stored.
	byKeys string
	// update: ($1 keys, $2 the stored values read, $3 the new ones) → the keys
	// updated. A row whose value is no longer the one read is left as it is.
	update string
}

// keyTables are the two places keys are stored (docs/security.md, "Private keys at rest").
// Certificates are paged by their primary key; ACME accounts are one per directory,
// a handful, and need no index.
var keyTables = []keyTable{{
	what:   "certificate key",
	table:  "proxy_certificates",
	reads:  []string{"id", "domain", "private_key_pem"},
	page:   `SELECT id::text, lower(domain), private_key_pem FROM proxy_certificates WHERE $1::uuid IS NULL OR id > $1::uuid ORDER BY id LIMIT $2`,
	byKeys: `SELECT id::text, lower(domain), private_key_pem FROM proxy_certificates WHERE id = ANY($1::uuid[])`,
	update: `UPDATE proxy_certificates c SET private_key_pem = u.new
FROM unnest($1::uuid[], $2::text[], $3::text[]) AS u(id, old, new)
WHERE c.id = u.id AND c.private_key_pem = u.old RETURNING c.id::text`,
}, {
	what:   "ACME account key",
	table:  "certworker_acme_accounts",
	reads:  []string{"directory", "eab_kid", "private_key_pem"},
	page:   `SELECT directory || E'\n' || eab_kid, directory, private_key_pem FROM certworker_acme_accounts WHERE $1::text IS NULL OR directory || E'\n' || eab_kid > $1 ORDER BY 1 LIMIT $2`,
	byKeys: `SELECT directory || E'\n' || eab_kid, directory, private_key_pem FROM certworker_acme_accounts WHERE directory || E'\n' || eab_kid = ANY($1::text[])`,
	update: `UPDATE certworker_acme_accounts a SET private_key_pem = u.new
FROM unnest($1::text[], $2::text[], $3::text[]) AS u(k, old, new)
WHERE a.directory || E'\n' || a.eab_kid = u.k AND a.private_key_pem = u.old RETURNING u.k`,
}}

// checkRekeyPrivileges makes sure, before anything changes, that the role may read
// and re-seal every stored key, and refuses with a usage error (exit 2: the role in
// --database-url is the configuration to change, as for run's checks of it) naming
// each right it lacks. Without it a role that may re-seal one table but not the other
// (the workers' role of deploy/grants.sql, which may not UPDATE the account) re-seals
// the certificate keys and stops half way, on "permission denied".
// has_column_privilege is true as well for a right held on the whole table.
func checkRekeyPrivileges(ctx context.Context, pool *pgxpool.Pool) error {
	var tables, columns, privileges []string
	for _, t := range keyTables {
		for _, c := range t.reads {
			tables, columns, privileges = append(tables, t.table), append(columns, c), append(privileges, "SELECT")
		}
		tables, columns, privileges = append(tables, t.table), append(columns, "private_key_pem"), append(privileges, "UPDATE")
	}
	var role string
	var missing []string
	err := pool.QueryRow(ctx, `
SELECT current_user, coalesce(array_agg(m.what ORDER BY m.first), '{}') FROM (
    SELECT format('%s (%s) on %s', priv, string_agg(col, ', ' ORDER BY ord), tbl) AS what, min(ord) AS first
    FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS n(tbl, col, priv, ord)
    WHERE NOT has_column_privilege(tbl, col, priv)
    GROUP BY tbl, priv) m`, tables, columns, privileges).Scan(&role, &missing)
	if err != nil {
		return fmt.Errorf("check the role's privileges: %w", err)
	}
	if len(missing) > 0 {
		return usagef("--database-url: role %q may not %s, so nothing changed: run rekey as the owner of the tables (the role migrate runs as), or a role that may SELECT both tables and UPDATE their private_key_pem",
			role, strings.Join(missing, ", nor "))
	}
	return nil
}

// storedKey is one row's key as read.
type storedKey struct {
	key, aad, stored string
}

// rekeyResult counts what a rekey did.
type rekeyResult struct {
	// resealed by table, and how many of them were PEM.
	resealed map[string]int
	plain    int
	// current: already sealed with the first key (counted in the check).
	current int
}

func (r rekeyResult) summary(keyID string) string {
	total, parts := 0, []string{}
	for _, t := range keyTables {
		total += r.resealed[t.what]
		parts = append(parts, fmt.Sprintf("%d %ss", r.resealed[t.what], t.what))
	}
	return fmt.Sprintf("re-sealed %d keys with key %s (%s; %d of them were stored as PEM); %d were already sealed with it",
		total, keyID, strings.Join(parts, ", "), r.plain, r.current)
}

// rekeyer re-seals every stored key with the first key of keys, in batches of one
// transaction each, while workers may be storing keys: each write is conditional on
// the row still holding what was read.
type rekeyer struct {
	pool  *pgxpool.Pool
	keys  seal.Keyring
	batch int
	// beforeUpdate, when set, runs before each batch is written: tests use it to
	// change a row between the read and the write, as a worker storing a renewal
	// would.
	beforeUpdate func()
}

func newRekeyer(pool *pgxpool.Pool, keys seal.Keyring, batch int) *rekeyer {
	return &rekeyer{pool: pool, keys: keys, batch: batch}
}

// run checks every stored key first and changes nothing when one opens with none of
// the keys; then re-seals, table by table.
func (r *rekeyer) run(ctx context.Context) (rekeyResult, error) {
	res := rekeyResult{resealed: map[string]int{}}
	var unopenable []string
	for _, t := range keyTables {
		err := r.pages(ctx, t, func(rows []storedKey) error {
			for _, k := range rows {
				if _, err := r.keys.Open(k.stored, k.aad); err != nil {
					unopenable = append(unopenable, t.what+" of "+k.aad)
				} else if r.keys.Current(k.stored) {
					res.current++
				}
			}
			return nil
		})
		if err != nil {
			return res, err
		}
	}
	if len(unopenable) > 0 {
		return res, refusal(unopenable)
	}
	for _, t := range keyTables {
		if err := r.reseal(ctx, t, &res); err != nil {
			return res, err
		}
	}
	return res, nil
}

func refusal(unopenable []string) error {
	named := unopenable[:min(refusalNames, len(unopenable))]
	more := ""
	if n := len(unopenable) - len(named); n > 0 {
		more = fmt.Sprintf(" and %d more", n)
	}
	return fmt.Errorf("refused, nothing changed: %d stored keys open with none of the given keys (%s%s); add the key they were sealed with to --key-encryption-key",
		len(unopenable), strings.Join(named, ", "), more)
}

// pages calls f with every row of t, a batch at a time.
func (r *rekeyer) pages(ctx context.Context, t keyTable, f func([]storedKey) error) error {
	var after *string
	for {
		rows, err := r.read(ctx, t.page, after, r.batch)
		if err != nil {
			return fmt.Errorf("read %ss: %w", t.what, err)
		}
		if len(rows) == 0 {
			return nil
		}
		if err := f(rows); err != nil {
			return err
		}
		after = &rows[len(rows)-1].key
	}
}

func (r *rekeyer) read(ctx context.Context, sql string, args ...any) ([]storedKey, error) {
	rows, err := r.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (storedKey, error) {
		var k storedKey
		err := row.Scan(&k.key, &k.aad, &k.stored)
		return k, err
	})
}

// reseal re-seals t's keys that are not current, then, up to rekeyRounds times, the
// ones that changed between the read and the write.
func (r *rekeyer) reseal(ctx context.Context, t keyTable, res *rekeyResult) error {
	var changed []string
	err := r.pages(ctx, t, func(rows []storedKey) error {
		missed, err := r.write(ctx, t, rows, res)
		changed = append(changed, missed...)
		return err
	})
	for round := 0; err == nil && len(changed) > 0 && round < rekeyRounds; round++ {
		var rows []storedKey
		if rows, err = r.read(ctx, t.byKeys, changed); err != nil {
			return fmt.Errorf("read %ss again: %w", t.what, err)
		}
		changed, err = r.write(ctx, t, rows, res)
	}
	if err == nil && len(changed) > 0 {
		err = fmt.Errorf("%d %ss changed every time rekey read them; the others are re-sealed: run rekey again", len(changed), t.what)
	}
	return err
}

// write re-seals the rows among rows that are not current, in one statement, and
// returns the keys of those that changed since they were read.
func (r *rekeyer) write(ctx context.Context, t keyTable, rows []storedKey, res *rekeyResult) ([]string, error) {
	var keys, olds, news []string
	plain := map[string]bool{}
	for _, k := range rows {
		if r.keys.Current(k.stored) {
			continue
		}
		keyPEM, err := r.keys.Open(k.stored, k.aad)
		if err != nil {
			// Written since the check with a key not in the list.
			return nil, fmt.Errorf("%s of %s: %w; the keys before it are re-sealed", t.what, k.aad, err)
		}
		sealed, err := r.keys.Seal(keyPEM, k.aad)
		if err != nil {
			return nil, err
		}
		keys, olds, news = append(keys, k.key), append(olds, k.stored), append(news, sealed)
		plain[k.key] = !seal.IsSealed(k.stored)
	}
	if len(keys) == 0 {
		return nil, nil
	}
	if r.beforeUpdate != nil {
		r.beforeUpdate()
	}
	rs, err := r.pool.Query(ctx, t.update, keys, olds, news)
	if err != nil {
		return nil, fmt.Errorf("re-seal %ss: %w", t.what, err)
	}
	done, err := pgx.CollectRows(rs, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("re-seal %ss: %w", t.what, err)
	}
	updated := make(map[string]bool, len(done))
	for _, k := range done {
		updated[k] = true
		res.resealed[t.what]++
		if plain[k] {
			res.plain++
		}
	}
	var missed []string
	for _, k := range keys {
		if !updated[k] {
			missed = append(missed, k)
		}
	}
	return missed, nil
}
