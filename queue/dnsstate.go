package queue

import (
	"context"
	"fmt"
)

// The ACME challenges an order can be validated with (certworker_dns_state.challenge).
const (
	ChallengeHTTP01 = "http-01"
	ChallengeDNS01  = "dns-01"
)

// maxChallengeReason bounds the reason stored: it quotes DNS names, 253 bytes each.
const maxChallengeReason = 1000

// RecordChallenge records the challenge chosen for a domain's order and why, for
// `status DOMAIN`. It writes certworker's own table only (no lock on the proxy's
// row), and only when what it says changed.
func (q *Queue) RecordChallenge(ctx context.Context, domainID, challenge, reason string) error {
	if len(reason) > maxChallengeReason {
		reason = reason[:maxChallengeReason]
	}
	_, err := q.db.Exec(ctx, `
INSERT INTO certworker_dns_state (domain_id, challenge, challenge_reason, challenge_at, updated_at)
VALUES ($1::uuid, $2, $3, now(), now())
ON CONFLICT (domain_id) DO UPDATE
    SET challenge = EXCLUDED.challenge, challenge_reason = EXCLUDED.challenge_reason,
        challenge_at = EXCLUDED.challenge_at, updated_at = EXCLUDED.updated_at
WHERE certworker_dns_state.challenge IS DISTINCT FROM EXCLUDED.challenge
   OR certworker_dns_state.challenge_reason IS DISTINCT FROM EXCLUDED.challenge_reason`,
		domainID, challenge, reason)
	if err != nil {
		return fmt.Errorf("record the challenge chosen: %w", err)
	}
	return nil
}
