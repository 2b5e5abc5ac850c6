package acme_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/queue"
)

// requestsPerOrder issues one order to warm the issuer up (the account's
// registration), then n more, and returns what the CA saw for the warm-up and, per
// step, for the n orders together.
func requestsPerOrder(t testing.TB, b *bed, n int) (first, rest map[pebbletest.Step]int) {
	iss := newIssuer(t.(*testing.T), b.pool, nil, b.config())
	ctx := testCtx(t.(*testing.T), time.Minute)
	before := b.ca.Requests()
	_, err := iss.Issue(ctx, queue.Request{Domain: randomName("q")})
	require.NoError(t, err)
	warm := b.ca.Requests()
	for range n {
		_, err := iss.Issue(ctx, queue.Request{Domain: randomName("q")})
		require.NoError(t, err)
	}
	return diff(warm, before), diff(b.ca.Requests(), warm)
}

func diff(after, before map[pebbletest.Step]int) map[pebbletest.Step]int {
	out := map[pebbletest.Step]int{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

func total(m map[pebbletest.Step]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func format(m map[pebbletest.Step]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

// What one order costs the CA, counted at Pebble by step. Guards against orders that
// fetch the directory or a fresh nonce again, or poll more than they need to.
func TestIssue_RequestsPerOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	const n = 5
	first, rest := requestsPerOrder(t, b, n)
	t.Logf("first order (registers the account): %d requests: %s", total(first), format(first))
	t.Logf("each of %d further orders: %.1f requests: %s", n, float64(total(rest))/n, format(rest))
}
