package worker

import (
	"context"
	"time"

	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// Store is what the loop needs of the database (package queue implements it). Every
// method is safe for concurrent use and writes under the claim's token.
type Store interface {
	Claims
	Results
	Waits
	Ledger
	Upkeep
}

var _ Store = (*queue.Queue)(nil)

// Claims take domains for orders, and find the claims this instance lost or left.
type Claims interface {
	Claim(ctx context.Context, owner, directory string, limit int) ([]issuing.Claim, error)
	ClaimShared(ctx context.Context, owner, directory string, limit, newcomers int) ([]issuing.Claim, error)
	ClaimInLine(ctx context.Context, owner, directory string, limit, newcomers int) ([]issuing.Claim, error)
	NotifyDomains(ctx context.Context, ids []string) error
	ConfirmClaim(ctx context.Context, token string) (time.Duration, error)
	ReclaimAbandoned(ctx context.Context) ([]queue.Reclaimed, error)
	ReleaseUntracked(ctx context.Context, owner string, keep []string) ([]queue.Untracked, error)
	NextDueSeeing(ctx context.Context, directory string, xids []uint32) (d time.Duration, ok bool, unseen []uint32, err error)
}

// Results record how an order ended, under its claim.
type Results interface {
	MarkActive(ctx context.Context, c issuing.Claim, cert *issuing.Certificate) (time.Duration, error)
	MarkFailed(ctx context.Context, c issuing.Claim, reason string) (issuing.Failure, error)
	MarkPermanent(ctx context.Context, c issuing.Claim, reason string) error
	Release(ctx context.Context, c issuing.Claim, quiet bool) error
	Hold(ctx context.Context, c issuing.Claim, quiet bool, reason string) error
	Disown(ctx context.Context, c issuing.Claim) (bool, error)
	RecordRefused(ctx context.Context, c issuing.Claim, directory, cause string) error
	ForgetRefused(ctx context.Context, c issuing.Claim) error
	RefuseProfile(ctx context.Context, c issuing.Claim, profile, reasonNone, reasonKept string) (renew bool, err error)
}

// Waits keep the domains that wait for their DNS, and their checks.
type Waits interface {
	Wait(ctx context.Context, c issuing.Claim, msg, answer string, checkIn time.Duration) error
	DueWaits(ctx context.Context, t queue.TakeWaits) ([]queue.DueWait, int, error)
	Recheck(ctx context.Context, id string, checkIn, seenIn time.Duration, answer, msg string) error
	EndWait(ctx context.Context, id string) (bool, error)
	ExpireWait(ctx context.Context, id, msg string) (bool, error)
	ReturnRetried(ctx context.Context, limit int) (int64, error)
}

// Ledger admits orders against the CA's limits, and keeps its pauses and budget.
type Ledger interface {
	Admit(ctx context.Context, directory string, limits issuing.Limits, as []queue.Admission) (admitted []issuing.Claim, refused []queue.Refusal, err error)
	Readmit(ctx context.Context, directory string, limits issuing.Limits, a queue.Admission) error
	SettleLedger(ctx context.Context, directory, token, outcome string, limits issuing.Limits) error
	SettleStaleLedger(ctx context.Context, directory string, olderThan time.Duration) (int64, error)
	PauseAt(ctx context.Context, directory, scope, key, source string, wait time.Duration, reason string) (time.Duration, error)
	PauseUnreachable(ctx context.Context, directory, reason string, base, limit time.Duration) (issuing.Unreachable, error)
	ClearUnreachable(ctx context.Context, directory string) (bool, error)
	TakeRenewalInfoTokens(ctx context.Context, directory string, want int, perSecond float64) (got int, wait time.Duration, err error)
	ReturnRenewalInfoTokens(ctx context.Context, directory string, n int, perSecond float64) error
}

// Upkeep is the maintenance: renewals, the fleet's duties and settings, and pruning.
type Upkeep interface {
	MarkRenewals(ctx context.Context) (issuing.RenewalPass, error)
	PromoteUrgentRenewals(ctx context.Context) (int64, error)
	FailExhausted(ctx context.Context) ([]issuing.BadRow, error)
	MarkCaseDuplicates(ctx context.Context) (marked, restored []issuing.BadRow, err error)
	RequeueProfileChanges(ctx context.Context) (int64, error)
	ClaimRenewalInfo(ctx context.Context, n int) ([]queue.RenewalInfoCandidate, int, error)
	RecordRenewalInfo(ctx context.Context, c queue.RenewalInfoCandidate, info issuing.RenewalInfo) (time.Duration, error)
	NextRenewalInfo(ctx context.Context) (d time.Duration, ok bool, err error)
	NextMaintenance(ctx context.Context) (queue.Maintenance, error)
	Prune(ctx context.Context, keep ...queue.LedgerWindow) (queue.PruneResult, error)
	RecordWithdrawals(ctx context.Context) (int64, error)
	TakeDuty(ctx context.Context, duty, holder string, ttl time.Duration) (held bool, left time.Duration, err error)
	ReleaseDuty(ctx context.Context, duty, holder string) error
	RecordSettings(ctx context.Context, s queue.FleetSettings) (prev queue.FleetSettings, ok bool, err error)
	SetWakeMode(ctx context.Context, mode string) (previous string, err error)
}
