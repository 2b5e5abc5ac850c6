-- Every suffix of a name with at least two labels, the name first: the keys under
-- which a pause of its registered domain can be stored, whatever the public suffix
-- list makes of it (the worker computes the registered domain; the claim only needs
-- to find it among these).
CREATE OR REPLACE FUNCTION certworker_suffixes(p_name text) RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT COALESCE(array_agg(array_to_string(l[i:], '.') ORDER BY i), '{}')
    FROM (SELECT string_to_array(lower(p_name), '.') AS l) s,
         generate_series(1, GREATEST(cardinality(l) - 1, 0)) AS i
$$;
