package queue

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/certworker/certworker/queue/issuing"
)

var takeRenewalInfoTokensSQL = `
INSERT INTO certworker_ari_buckets AS b (directory, tokens, refilled_at, granted)
VALUES ($1, $4::float8 - LEAST($2::int, floor($4::float8)), clock_timestamp(), LEAST($2::int, floor($4::float8)))
ON CONFLICT (directory) DO UPDATE SET (granted, tokens, refilled_at) = (
    SELECT g, avail - g, at FROM (
        SELECT LEAST($2::int, floor(avail))::int AS g, avail, at FROM (
            SELECT LEAST($4::float8, b.tokens + $3::float8 * GREATEST(0, EXTRACT(epoch FROM t.at - b.refilled_at)::float8)) AS avail,
                   GREATEST(b.refilled_at, t.at) AS at
            FROM (SELECT clock_timestamp() AS at) t) a) g)
RETURNING b.granted, b.tokens`

// TakeRenewalInfoTokens takes up to want tokens from the fleet's bucket for the CA at
// directory, refilled at perSecond; every renewal-information request takes one. It
// returns how many it took and, when fewer than want, how long until want (or a full
// bucket) will be there, so the caller comes back for a batch.
//
// One statement, so the bucket's row is never locked across a request; the clock is
// the database's, so instances whose clocks differ share one bucket.
func (q *Queue) TakeRenewalInfoTokens(ctx context.Context, directory string, want int, perSecond float64) (got int, wait time.Duration, err error) {
	if !(perSecond > 0) || math.IsInf(perSecond, 0) {
		return 0, 0, issuing.ErrBadRate
	}
	if want <= 0 {
		return 0, 0, nil
	}
	burst := renewalInfoBurst(perSecond)
	var left float64
	err = q.db.QueryRow(ctx, takeRenewalInfoTokensSQL, directory, want, perSecond, burst).Scan(&got, &left)
	if err != nil {
		return 0, 0, fmt.Errorf("take renewal-information tokens: %w", err)
	}
	if got < want {
		need := min(float64(want), burst) - left
		wait = time.Duration(max(need, 0) / perSecond * float64(time.Second))
	}
	return got, wait, nil
}

var returnRenewalInfoTokensSQL = `
UPDATE certworker_ari_buckets SET tokens = LEAST($3, tokens + $2) WHERE directory = $1`

// ReturnRenewalInfoTokens puts back n tokens taken and not spent.
func (q *Queue) ReturnRenewalInfoTokens(ctx context.Context, directory string, n int, perSecond float64) error {
	if n <= 0 {
		return nil
	}
	if !(perSecond > 0) || math.IsInf(perSecond, 0) {
		return issuing.ErrBadRate
	}
	if _, err := q.db.Exec(ctx, returnRenewalInfoTokensSQL,
		directory, n, renewalInfoBurst(perSecond)); err != nil {
		return fmt.Errorf("return renewal-information tokens: %w", err)
	}
	return nil
}

// renewalInfoBurst is the bucket's size: a second's worth, at least one token, so in
// any t seconds the CA sees at most rate * (t + 1) requests.
func renewalInfoBurst(perSecond float64) float64 { return max(perSecond, 1) }
