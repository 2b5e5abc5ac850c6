package acme_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const (
	// validationBenchOrders is how many domains each validation time gets; the
	// times take turns, domain by domain, so that a change of the machine's load
	// falls on all of them.
	validationBenchOrders = 9
	validationBenchFile   = "../bench/verify-by-validation.txt"
	validationBenchCmd    = "CERTWORKER_PG_IMAGE=certworker-postgres:15 go test -run '^$' -bench BenchmarkVerifyByValidation -benchtime 1x ./acme/"
)

// validationBenchTimes are the CA's validation times the benchmark sets: at once,
// within the first looks, and on either side of where the schedule before the curve
// left a cliff (nothing between 100 ms and 1 s).
var validationBenchTimes = []time.Duration{0, 100 * ms, 300 * ms, 700 * ms, 1500 * ms}

// validationRun is one domain's way to active at a validation time, and how long
// after the CA's verdict was given out the order saw it.
type validationRun struct {
	verifyRun
	seenAfter time.Duration
}

// BenchmarkVerifyByValidation: as BenchmarkVerifyToServed, but the CA takes a set
// time to validate (the relay before Pebble holds the authorization's "valid" back
// that long after its answer to the challenge, as a CA validating from several
// network perspectives does), and says nothing of when to look. For each validation
// time it reports verify -> active minus that time (median and max), how long after
// the CA's verdict was given out the order saw it, and the requests per order.
// Results go to bench/verify-by-validation.txt.
func BenchmarkVerifyByValidation(b *testing.B) {
	v := startVerifyBench(b)
	load := loadAvg()
	_ = v.one(b) // registers the account
	runs := map[time.Duration][]validationRun{}
	b.ResetTimer()
	for range b.N {
		clear(runs)
		for range validationBenchOrders {
			for _, d := range validationBenchTimes {
				v.front.SetValidationTime(d)
				r := validationRun{verifyRun: v.one(b)}
				vs := v.front.Validations()
				last := vs[len(vs)-1]
				for _, l := range last.Looks {
					if l.Status == "valid" {
						r.seenAfter = max(l.At.Sub(last.Ready), 0)
						break
					}
				}
				runs[d] = append(runs[d], r)
			}
		}
	}
	b.StopTimer()
	writeValidationTable(b, load, runs)
}

func writeValidationTable(b *testing.B, load string, runs map[time.Duration][]validationRun) {
	var sb strings.Builder
	sb.WriteString("# Verify -> active by the CA's validation time: as verify-to-served.txt (real worker, issuer,\n")
	sb.WriteString("# responder, certstore; in-process Pebble), but a relay before Pebble holds each authorization's\n")
	sb.WriteString("# \"valid\" back for the validation time after its answer to the challenge, as a CA validating from\n")
	sb.WriteString("# several network perspectives does; no Retry-After. 'active - validation' is verify -> active\n")
	sb.WriteString("# minus that time: our share, with the CA's answers and Pebble's own validation (a few ms).\n")
	sb.WriteString("# 'seen after' is from the moment the relay gave out \"valid\" to the look that got it (the\n")
	sb.WriteString("# relay's own timestamps). The validation times take turns, domain by domain.\n")
	tw := benchTable(&sb, load, validationBenchCmd)
	fmt.Fprintln(tw, "validation ms\tn\tactive - validation p50 ms\tmax ms\tseen after p50 ms\tmax ms\tserved - validation p50 ms\trequests/order\tauthorization looks/order\t")
	for _, d := range validationBenchTimes {
		rs := runs[d]
		plain := make([]verifyRun, len(rs))
		seen := make([]verifyRun, len(rs))
		reqs, looks := 0, 0
		for i, r := range rs {
			plain[i] = r.verifyRun
			plain[i].active -= d
			plain[i].served -= d
			seen[i].active = r.seenAfter
			reqs += total(r.requests)
			looks += r.requests["authorization"] - 1 // the fetch before the challenge
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\t%s\t%.1f\t%.1f\t\n", d.Milliseconds(), len(rs),
			fmtMS(median(plain, func(r verifyRun) time.Duration { return r.active })),
			fmtMS(quantile(plain, func(r verifyRun) time.Duration { return r.active }, 1)),
			fmtMS(median(seen, func(r verifyRun) time.Duration { return r.active })),
			fmtMS(quantile(seen, func(r verifyRun) time.Duration { return r.active }, 1)),
			fmtMS(median(plain, func(r verifyRun) time.Duration { return r.served })),
			float64(reqs)/float64(len(rs)), float64(looks)/float64(len(rs)))
	}
	require.NoError(b, tw.Flush())
	b.Log("\n" + sb.String())
	require.NoError(b, os.WriteFile(validationBenchFile, []byte(sb.String()), 0o644))
}
