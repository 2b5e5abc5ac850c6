package queue

import (
	"flag"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/certworker/certworker/queue/issuing"
)

var update = flag.Bool("update", false, "rewrite the golden files of testdata/sql from the statements as rendered")

// renderedStatements are the statements the package renders from named conditions,
// whole, as PostgreSQL receives them. A review reads the whole SQL a change makes in
// testdata/sql, not the glue.
func renderedStatements() map[string]string {
	stmts := fixedStatements()
	// The statements rendered from the configuration, for the default one with one
	// CA and with a second.
	const first, second = "https://ca.invalid/directory", "https://second.invalid/directory"
	one := New(nil, issuing.DefaultConfig())
	routedCfg := issuing.DefaultConfig()
	routedCfg.Fallback = &issuing.Fallback{Directory: second}
	two := New(nil, routedCfg)
	stmts["next_due"], _ = one.nextDueStatement(first)
	stmts["next_due_two_cas"], _ = two.nextDueStatement(first)
	stmts["return_held"] = one.returnHeldStatement(first)
	stmts["return_held_two_cas"] = two.returnHeldStatement(first)
	return stmts
}

// fixedStatements are the statements whose text no configuration changes.
func fixedStatements() map[string]string {
	return map[string]string{
		"claim":                      claimSQL,
		"hold":                       holdSQL,
		"release":                    releaseSQL,
		"domain_status":              domainStatusSQL,
		"domain_events":              domainEventsSQL,
		"domain_events_since":        domainEventsSinceSQL,
		"prune_old_events":           pruneOldEventsSQL,
		"prune_extra_events":         pruneExtraEventsSQL,
		"mark_active":                markActiveSQL,
		"claim_routed":               claimRoutedSQL,
		"twin_candidates":            twinCandidatesSQL,
		"replace_progress":           replaceProgressSQL,
		"tenant_counts":              tenantCountsSQL,
		"status_counts":              statusCountsSQL,
		"totals":                     totalsSQL,
		"expiring_unrenewed":         expiringUnrenewedSQL,
		"pending_over_hour":          pendingOverHourSQL,
		"pauses":                     pausesSQL,
		"ledger":                     ledgerSQL,
		"pause":                      pauseSQL,
		"look_up":                    lookUpSQL,
		"retry":                      retrySQL,
		"queue_for_issuance":         queueForIssuanceSQL,
		"update_domain":              updateDomainSQL,
		"take_renewal_info_tokens":   takeRenewalInfoTokensSQL,
		"return_renewal_info_tokens": returnRenewalInfoTokensSQL,
		"release_untracked":          releaseUntrackedSQL,
		"record_challenge":           recordChallengeSQL,
		"forget_orphan_waits":        forgetOrphanWaitsSQL,
		"end_stale_waits":            endStaleWaitsSQL,
		"take_due_waits":             takeDueWaitsSQL,
		"recheck_wait":               recheckWaitSQL,
		"recheck_error":              recheckErrorSQL,
		"end_wait_domain":            endWaitDomainSQL,
		"end_wait_state":             endWaitStateSQL,
		"expire_wait_domain":         expireWaitDomainSQL,
		"expire_wait_state":          expireWaitStateSQL,
		"return_retried":             returnRetriedSQL,
		"mark_case_duplicates":       markCaseDuplicatesSQL,
		"take_duty":                  takeDutySQL,
		"release_duty":               releaseDutySQL,
		"exhausted_rows":             exhaustedRowsSQL,
		"fail_exhausted_rows":        failExhaustedRowsSQL,
		"record_withdrawals":         recordWithdrawalsSQL,
		"record_refused":             recordRefusedSQL,
		"forget_refused":             forgetRefusedSQL,
		"redirect_claim":             redirectClaimSQL,
		"why_not_held":               whyNotHeldSQL,
		"disown":                     disownSQL,
		"mark_permanent":             markPermanentSQL,
		"renew_leases":               renewLeasesSQL,
		"ledger_lock":                ledgerLockSQL,
		"read_buckets":               readBucketsSQL,
		"write_bucket":               writeBucketSQL,
		"delete_bucket":              deleteBucketSQL,
		"ledger_reroute":             ledgerRerouteSQL,
		"ledger_stop":                ledgerStopSQL,
		"ledger_insert":              ledgerInsertSQL,
		"ledger_hand_back":           ledgerHandBackSQL,
		"ledger_pause":               ledgerPauseSQL,
		"readmit":                    readmitSQL,
		"settle_ledger":              settleLedgerSQL,
		"settle_stale_ledger":        settleStaleLedgerSQL,
		"pause_at":                   pauseAtSQL,
		"pause_unreachable":          pauseUnreachableSQL,
		"clear_unreachable":          clearUnreachableSQL,
		"ca_pause":                   caPauseSQL,
		"refuse_profile":             refuseProfileSQL,
		"requeue_profile_changes":    requeueProfileChangesSQL,
		"set_profile":                setProfileSQL,
		"reclaim_abandoned":          reclaimAbandonedSQL,
		"requeue_due":                requeueDueSQL,
		"read_unscheduled":           readUnscheduledSQL,
		"schedule":                   scheduleSQL,
		"requeue_for_issuance":       requeueForIssuanceSQL,
		"claim_renewal_info":         claimRenewalInfoSQL,
		"next_renewal_info":          nextRenewalInfoSQL,
		"record_renewal_info":        recordRenewalInfoSQL,
		"ascii_only":                 asciiOnlySQL,
		"next_maintenance":           nextMaintenanceSQL,
		"promote_urgent_renewals":    promoteUrgentRenewalsSQL,
		"wake_mode":                  wakeModeSQL,
		"set_wake_mode":              setWakeModeSQL,
		"record_settings":            recordSettingsSQL,
		"settings":                   settingsSQL,
		"record_d_n_s_0_1_zone":      recordDNS01ZoneSQL,
		"counts":                     countsSQL,
		"overview":                   overviewSQL,
		"issuer_counts":              issuerCountsSQL,
		"profile_counts":             profileCountsSQL,
		"list_pauses":                listPausesSQL,
		"state":                      stateSQL,
	}
}

// TestStatements_MatchTheirGoldenFiles fails on any difference between a rendered
// statement and testdata/sql/NAME.sql, and on a golden file no statement has; only
// `go test -run TestStatements_MatchTheirGoldenFiles -update ./queue/` rewrites them.
func TestStatements_MatchTheirGoldenFiles(t *testing.T) {
	dir := filepath.Join("testdata", "sql")
	stmts := renderedStatements()
	if *update {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		old, _ := filepath.Glob(filepath.Join(dir, "*.sql"))
		for _, f := range old {
			if err := os.Remove(f); err != nil {
				t.Fatal(err)
			}
		}
		for name, text := range stmts {
			if err := os.WriteFile(filepath.Join(dir, name+".sql"), []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name, text := range stmts {
		want, err := os.ReadFile(filepath.Join(dir, name+".sql"))
		if err != nil {
			t.Errorf("%s: no golden file (go test -run %s -update ./queue/ writes it): %v", name, t.Name(), err)
			continue
		}
		if string(want) != text {
			t.Errorf("%s: the rendered statement differs from testdata/sql/%s.sql at byte %d;\nrun go test -run %s -update ./queue/ and review the diff",
				name, name, firstDifference(string(want), text), t.Name())
		}
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.sql"))
	if err != nil {
		t.Fatal(err)
	}
	var stray []string
	for _, f := range files {
		if _, ok := stmts[strings.TrimSuffix(filepath.Base(f), ".sql")]; !ok {
			stray = append(stray, f)
		}
	}
	sort.Strings(stray)
	if len(stray) > 0 {
		t.Errorf("golden files no statement renders: %v", stray)
	}
}

func firstDifference(a, b string) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
