WITH sequence_locks AS
(SELECT count(pg_advisory_xact_lock(%(pg_advisory_xact_lock_1)s::INTEGER, ordered_lock_numbers.n)) AS count_2
FROM (SELECT lock_numbers.n AS n
FROM (SELECT DISTINCT get_byte(sa_job.sequence_key, %(get_byte_1)s::INTEGER) AS n
FROM sa_job
WHERE sa_job.id IN (SELECT unnest(%(sa_jobs_completed_ids)s::BIGINT[]) AS unnest_1) AND sa_job.sequence_key IS NOT NULL) AS lock_numbers ORDER BY lock_numbers.n) AS ordered_lock_numbers)
 UPDATE sa_job SET state='completed', finalized_at=now(), job_key=NULL FROM unnest(%(sa_jobs_completed_ids)s::BIGINT[], %(sa_jobs_completed_runs)s::INTEGER[]) AS outcome(id, run) WHERE sa_job.id = outcome.id AND sa_job.run_count = outcome.run AND CAST(sa_job.state AS TEXT) = 'running' AND sa_job.id = ANY (CAST((SELECT array_agg(outcome.id) AS array_agg_1
FROM unnest(%(sa_jobs_completed_ids)s::BIGINT[], %(sa_jobs_completed_runs)s::INTEGER[]) AS outcome(id, run)) AS BIGINT[])) AND (SELECT count(*) AS count_1
FROM sequence_locks) >= %(param_1)s::INTEGER RETURNING sa_job.id, sa_job.state
