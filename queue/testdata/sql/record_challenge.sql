
INSERT INTO certworker_dns_state (domain_id, challenge, challenge_reason, challenge_at, updated_at)
VALUES ($1::uuid, $2, $3, now(), now())
ON CONFLICT (domain_id) DO UPDATE
    SET challenge = EXCLUDED.challenge, challenge_reason = EXCLUDED.challenge_reason,
        challenge_at = EXCLUDED.challenge_at, updated_at = EXCLUDED.updated_at
WHERE certworker_dns_state.challenge IS DISTINCT FROM EXCLUDED.challenge
   OR certworker_dns_state.challenge_reason IS DISTINCT FROM EXCLUDED.challenge_reason