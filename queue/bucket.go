package queue

import (
	"context"
	"fmt"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5"
)

// The ledger's limits are token buckets, as Let's Encrypt counts them (GCRA, the
// "generic cell rate algorithm" of Boulder's ratelimits package): a limit of
// COUNT/DURATION holds a burst of COUNT tokens and gains one every DURATION/COUNT
// (the interval). A bucket's whole state is its theoretical arrival time (tat): it is
// full when tat is past; an order takes a token by moving tat to max(tat, now) +
// interval, which it may while tat stays within DURATION of now; a refund moves it
// back by one interval, never before now. The bucket holds
// ⌊(DURATION − (tat − now)) / interval⌋ tokens, and has k of them from
// tat − DURATION + k × interval on.
//
// The state is certworker_buckets' row of the CA's directory, the limit's kind and
// its key; no row is a full bucket. It is read and written only under the ledger's
// lock (inLedger), in the transaction that admits or settles the order, so that the
// instances of a fleet spend one bucket. It depends on no ledger row: pruning the
// ledger changes no bucket.

// The kinds of bucket (certworker_buckets.kind).
const (
	bucketAccount          = "account"
	bucketRegisteredDomain = "registered_domain"
	bucketExactSet         = "exact_set"
	bucketFailedAuthz      = "failed_authz"
	bucketConsecutive      = "consecutive_failures"
)

// dbResolution is the database's clock's resolution: a tat is stored to the
// microsecond. Token counts allow this much in the order's favour, so that a tat
// rounded on its way to the database does not lose a token that is there.
const dbResolution = time.Microsecond

// bucketTokens is how many tokens limit l's bucket holds at now, given its tat (the
// zero time for a full bucket); 0 for a bucket spent beyond empty.
func bucketTokens(l issuing.Limit, tat, now time.Time) int {
	debt := max(tat.Sub(now), 0)
	left := l.Window - debt + dbResolution
	if left < 0 {
		return 0
	}
	return min(int(left/l.Interval()), l.Count)
}

// bucketSpend is the tat after one token is taken at now.
func bucketSpend(l issuing.Limit, tat, now time.Time) time.Time {
	if tat.Before(now) {
		tat = now
	}
	return tat.Add(l.Interval())
}

// bucketRefund is the tat after one token is given back at now.
func bucketRefund(l issuing.Limit, tat, now time.Time) time.Time {
	tat = tat.Add(-l.Interval())
	if tat.Before(now) {
		return now
	}
	return tat
}

// bucketHoldsAt is the moment from which the bucket holds k tokens, on the
// database's clock (rounded up to its resolution, so that a claim at that moment
// finds them).
func bucketHoldsAt(l issuing.Limit, tat time.Time, k int) time.Time {
	t := tat.Add(-l.Window + time.Duration(k)*l.Interval())
	if r := t.Truncate(dbResolution); !r.Equal(t) {
		return r.Add(dbResolution)
	}
	return t
}

// buckets are the states of the buckets one ledger transaction reads and writes, at
// the transaction's time.
type buckets struct {
	directory string
	now       time.Time
	tat       map[ledgerKey]time.Time
	// dirty are the buckets changed, to write back.
	dirty map[ledgerKey]bool
	// gone are the buckets to delete (full again: a success resets the failures in a
	// row).
	gone map[ledgerKey]bool
}

var readBucketsSQL = `
SELECT now(), b.kind, b.key, b.tat
FROM (SELECT 1) AS one
LEFT JOIN certworker_buckets b ON b.directory = $1 AND (
       (b.kind = '` + bucketAccount + `' AND b.key = $1)
    OR (b.kind = '` + bucketRegisteredDomain + `' AND b.key = ANY ($2::text[]))
    OR (b.kind IN ('` + bucketExactSet + `', '` + bucketFailedAuthz + `', '` + bucketConsecutive + `') AND b.key = ANY ($3::text[])))`

// readBuckets reads, under the ledger's lock, the buckets of directory that the names
// and registered domains given can touch, and the transaction's time.
func readBuckets(ctx context.Context, tx pgx.Tx, directory string, rds, names []string) (*buckets, error) {
	rows, err := tx.Query(ctx, readBucketsSQL, directory, rds, names)
	if err != nil {
		return nil, fmt.Errorf("read the ledger's buckets: %w", err)
	}
	defer rows.Close()
	b := &buckets{directory: directory, tat: map[ledgerKey]time.Time{}, dirty: map[ledgerKey]bool{}, gone: map[ledgerKey]bool{}}
	for rows.Next() {
		var kind, key *string
		var tat *time.Time
		if err := rows.Scan(&b.now, &kind, &key, &tat); err != nil {
			return nil, fmt.Errorf("read the ledger's buckets: %w", err)
		}
		if kind != nil {
			b.tat[ledgerKey{*kind, *key}] = *tat
		}
	}
	return b, rows.Err()
}

// tokens is how many tokens the bucket of k under l holds now.
func (b *buckets) tokens(k ledgerKey, l issuing.Limit) int {
	return bucketTokens(l, b.tat[k], b.now)
}

// holdsAt is when the bucket of k under l holds n tokens.
func (b *buckets) holdsAt(k ledgerKey, l issuing.Limit, n int) time.Time {
	tat := b.tat[k]
	if tat.Before(b.now) {
		tat = b.now
	}
	return bucketHoldsAt(l, tat, n)
}

func (b *buckets) spend(k ledgerKey, l issuing.Limit) {
	b.tat[k], b.dirty[k] = bucketSpend(l, b.tat[k], b.now), true
	delete(b.gone, k)
}

func (b *buckets) refund(k ledgerKey, l issuing.Limit) {
	if tat, ok := b.tat[k]; ok {
		b.tat[k], b.dirty[k] = bucketRefund(l, tat, b.now), true
	}
}

func (b *buckets) reset(k ledgerKey) {
	delete(b.tat, k)
	delete(b.dirty, k)
	b.gone[k] = true
}

var (
	writeBucketSQL = `
INSERT INTO certworker_buckets (directory, kind, key, tat) VALUES ($1, $2, $3, $4)
ON CONFLICT (directory, kind, key) DO UPDATE SET tat = EXCLUDED.tat`
	deleteBucketSQL = `
DELETE FROM certworker_buckets WHERE directory = $1 AND kind = $2 AND key = $3`
)

// queue adds the writes of the changed buckets to batch.
func (b *buckets) queue(batch *pgx.Batch) {
	for k := range b.dirty {
		batch.Queue(writeBucketSQL, b.directory, k.kind, k.key, b.tat[k])
	}
	for k := range b.gone {
		batch.Queue(deleteBucketSQL, b.directory, k.kind, k.key)
	}
}

// describe is a limit as the ledger's reasons name it: its flag and value, and what
// it means as a bucket.
func describe(flag string, l issuing.Limit) string {
	return fmt.Sprintf("%s %s: a burst of %d, then one every %s", flag, l, l.Count, l.Interval())
}
