-- The proxy's domain update for a tenant (the reference's saas::db::update_domain):
-- a NULL argument leaves its field alone. Changing the provider resets the SSL state
-- to a fresh 'pending' with no history and drops any claim, so that a verified domain
-- switched to acme is queued (the wake trigger sees it enter the claimable set) rather
-- than left in whatever state the old provider left it, and an order running for a
-- domain switched away from acme cannot store its result (its claim is gone). One row,
-- the domain as it now is; no row, and nothing changed, for another tenant's domain.
-- A value outside the contract's sets fails with the CHECK constraint's error.
CREATE OR REPLACE FUNCTION certworker_update_domain(
    p_domain_id uuid, p_tenant_id uuid, p_verification_method text, p_ssl_provider text)
RETURNS SETOF proxy_domains
LANGUAGE sql AS $$
    UPDATE proxy_domains SET
        verification_method = COALESCE(p_verification_method, verification_method),
        ssl_status = CASE WHEN p_ssl_provider <> ssl_provider THEN 'pending' ELSE ssl_status END,
        ssl_attempts = CASE WHEN p_ssl_provider <> ssl_provider THEN 0 ELSE ssl_attempts END,
        ssl_error = CASE WHEN p_ssl_provider <> ssl_provider THEN NULL ELSE ssl_error END,
        ssl_last_attempt_at = CASE WHEN p_ssl_provider <> ssl_provider THEN NULL ELSE ssl_last_attempt_at END,
        ssl_claim_token = CASE WHEN p_ssl_provider <> ssl_provider THEN NULL ELSE ssl_claim_token END,
        ssl_claimed_by = CASE WHEN p_ssl_provider <> ssl_provider THEN NULL ELSE ssl_claimed_by END,
        ssl_lease_expires_at = CASE WHEN p_ssl_provider <> ssl_provider THEN NULL ELSE ssl_lease_expires_at END,
        ssl_provider = COALESCE(p_ssl_provider, ssl_provider),
        updated_at = now()
    WHERE id = p_domain_id AND tenant_id = p_tenant_id
    RETURNING *
$$;
