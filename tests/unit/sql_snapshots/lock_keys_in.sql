SELECT count(pg_advisory_xact_lock(%(pg_advisory_xact_lock_1)s::INTEGER, ordered_lock_numbers.n)) AS count_1
FROM (SELECT lock_numbers.n AS n
FROM (SELECT DISTINCT get_byte(job_rows.sequence_key, %(get_byte_1)s::INTEGER) AS n
FROM jsonb_to_recordset(%(sa_jobs_rows)s::JSONB) AS job_rows(ord INTEGER, kind TEXT, args JSONB, queue TEXT, priority SMALLINT, max_attempts SMALLINT, tags TEXT[], metadata JSONB, scheduled_at TIMESTAMP WITH TIME ZONE, unique_key BYTEA, unique_states BIT(8), unique_ttl FLOAT, unique_until_start BOOLEAN, sequence_key BYTEA, sequence_continue_on_cancelled BOOLEAN, sequence_continue_on_discarded BOOLEAN, job_key TEXT)
WHERE job_rows.sequence_key IS NOT NULL) AS lock_numbers ORDER BY lock_numbers.n) AS ordered_lock_numbers
