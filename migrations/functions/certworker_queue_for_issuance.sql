-- The proxy's "retry" for a tenant (the reference's saas::db::queue_for_issuance):
-- puts the tenant's domain back in the queue with its history cleared (pending,
-- attempts 0, error and last attempt cleared, so that the next pass takes it rather
-- than waiting out a backoff computed for a cause the tenant has just fixed), and every
-- CA's recorded refusal of the name forgotten (ssl_ca_refused and its cause), as
-- `certworker retry` forgets it: the tenant may have changed the CAA
-- records that caused it, and the CAs are asked afresh. The refusal is certworker's
-- column, which the proxy's role may not write: the trigger certworker_retried
-- (certworker_follow_proxy) forgets it, and lifts a hold, when this UPDATE clears the
-- history. Its WHEN needs a history to clear, and cannot be changed without DROP
-- TRIGGER (an ACCESS EXCLUSIVE lock on the proxy's table): a row with none (pending,
-- attempts 0, no error, no last attempt: a first issuance a CA refused and handed
-- back uncharged) that holds a refusal or a hold is given one first, its last attempt
-- stamped, in the same transaction, for the UPDATE to clear; nobody sees it. One row,
-- the domain as it now is, when it was queued; no row, and nothing changed, when it is
-- refused: another tenant's domain (a tenant never touches another's), one that is not
-- verified (an order for a name nobody has proved control of spends a rate limit for
-- nothing), not acme (its certificate is not ours to order), or already provisioning
-- or active (an order is running, or the certificate is renewed on its own schedule).
--
-- A failed domain entering the queue wakes the workers through the trigger; a pending
-- one (backing off) is in the claimable set already, so the trigger stays silent and
-- the function notifies itself, in notify mode as the trigger does.
CREATE OR REPLACE FUNCTION certworker_queue_for_issuance(p_domain_id uuid, p_tenant_id uuid)
RETURNS SETOF proxy_domains
LANGUAGE plpgsql AS $$
DECLARE
    v_status text;
    v_unseen boolean;
BEGIN
    SELECT ssl_status,
        ssl_status = 'pending' AND ssl_attempts = 0 AND ssl_error IS NULL AND ssl_last_attempt_at IS NULL
        AND (ssl_ca_refused IS NOT NULL OR ssl_ca_refused_cause IS NOT NULL OR ssl_held IS NOT NULL)
    INTO v_status, v_unseen FROM proxy_domains
    WHERE id = p_domain_id AND tenant_id = p_tenant_id
      AND verification_status = 'verified' AND ssl_provider = 'acme'
      AND ssl_status IN ('failed', 'pending')
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_unseen THEN
        UPDATE proxy_domains SET ssl_last_attempt_at = now() WHERE id = p_domain_id;
    END IF;
    RETURN QUERY
        UPDATE proxy_domains SET
            ssl_status = 'pending', ssl_attempts = 0, ssl_error = NULL,
            ssl_last_attempt_at = NULL, updated_at = now()
        WHERE id = p_domain_id
        RETURNING *;
    IF v_status = 'pending'
       AND COALESCE((SELECT wake FROM certworker_settings WHERE id), 'notify') = 'notify' THEN
        PERFORM pg_notify('certworker_wake', '');
    END IF;
END
$$;
