
WITH l AS (
    INSERT INTO certworker_ledger (directory, domain_id, name, registered_domain, renewal, exempt, claim_token, tenant_id)
    VALUES ($1, $2, $3, $4, $5, $6, $7, NULLIF($8, '')::uuid)
    RETURNING domain_id, tenant_id
)
SELECT certworker_domain_event(domain_id, tenant_id, 'ordered', NULL, NULL, now()) FROM l
WHERE domain_id IS NOT NULL AND tenant_id IS NOT NULL