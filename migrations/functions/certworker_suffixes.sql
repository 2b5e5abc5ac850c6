-- Every suffix of a name with at least two labels, the name first: the keys under
-- which a pause of its registered domain can be stored, whatever the public suffix
-- list makes of it (the worker computes the registered domain; the claim only needs
-- to find it among these). '{}' for NULL and for a name of one label.
--
-- PL/pgSQL, not SQL: the claim calls it for each row it reads while a pause is in
-- force. A SQL function whose body reads FROM something is not inlined: it is planned
-- again in every statement that calls it, and each call goes through the SQL
-- function executor. A PL/pgSQL function is compiled once a session;
-- migrations' BenchmarkSuffixes compares the two.
CREATE OR REPLACE FUNCTION certworker_suffixes(p_name text) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    suffixes text[] := '{}';
    rest text := lower(p_name);
    dot int;
BEGIN
    IF rest IS NULL THEN
        RETURN suffixes;
    END IF;
    LOOP
        dot := strpos(rest, '.');
        EXIT WHEN dot = 0;
        suffixes := suffixes || rest;
        rest := substr(rest, dot + 1);
    END LOOP;
    RETURN suffixes;
END
$$;
