
INSERT INTO certworker_ledger (directory, domain_id, name, registered_domain, renewal, exempt, claim_token, tenant_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, NULLIF($8, '')::uuid)