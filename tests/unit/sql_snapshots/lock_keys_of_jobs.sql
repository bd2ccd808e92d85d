SELECT count(pg_advisory_xact_lock(%(pg_advisory_xact_lock_1)s::INTEGER, ordered_lock_numbers.n)) AS count_1
FROM (SELECT lock_numbers.n AS n
FROM (SELECT DISTINCT get_byte(sa_job.sequence_key, %(get_byte_1)s::INTEGER) AS n
FROM sa_job
WHERE sa_job.id IN (SELECT unnest(%(sa_jobs_job_ids)s::BIGINT[]) AS unnest_1) AND sa_job.sequence_key IS NOT NULL) AS lock_numbers ORDER BY lock_numbers.n) AS ordered_lock_numbers
