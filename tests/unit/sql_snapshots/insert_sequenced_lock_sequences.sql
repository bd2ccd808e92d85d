WITH sequence_locks AS
(SELECT count(pg_advisory_xact_lock(%(pg_advisory_xact_lock_1)s::INTEGER, ordered_lock_numbers.n)) AS count_1
FROM (SELECT lock_numbers.n AS n
FROM (SELECT DISTINCT get_byte(job_rows.sequence_key, %(get_byte_1)s::INTEGER) AS n
FROM jsonb_to_recordset(%(sa_jobs_rows)s::JSONB) AS job_rows(ord INTEGER, kind TEXT, args JSONB, queue TEXT, priority SMALLINT, max_attempts SMALLINT, tags TEXT[], metadata JSONB, scheduled_at TIMESTAMP WITH TIME ZONE, unique_key BYTEA, unique_states BIT(8), unique_ttl FLOAT, unique_until_start BOOLEAN, sequence_key BYTEA, sequence_continue_on_cancelled BOOLEAN, sequence_continue_on_discarded BOOLEAN, job_key TEXT)
WHERE job_rows.sequence_key IS NOT NULL) AS lock_numbers ORDER BY lock_numbers.n) AS ordered_lock_numbers)
 INSERT INTO sa_job (kind, args, state, queue, priority, max_attempts, tags, metadata, scheduled_at, sequence_key, sequence_slot, sequence_continue_on_cancelled, sequence_continue_on_discarded) SELECT job_rows.kind, job_rows.args, CAST(CASE WHEN (job_rows.sequence_key IS NOT NULL AND (row_number() OVER (PARTITION BY job_rows.sequence_key ORDER BY job_rows.ord) > %(param_1)s::INTEGER OR (EXISTS (SELECT *
FROM sa_job AS holder
WHERE holder.sequence_key = job_rows.sequence_key AND holder.sequence_key IS NOT NULL AND holder.sequence_slot)) OR (EXISTS (SELECT *
FROM sa_job AS waiting
WHERE waiting.sequence_key = job_rows.sequence_key AND waiting.sequence_key IS NOT NULL AND waiting.state = 'pending')))) THEN %(param_2)s::VARCHAR WHEN (coalesce(job_rows.scheduled_at, now()) > now()) THEN %(param_3)s::VARCHAR ELSE %(param_4)s::VARCHAR END AS sa_job_state) AS anon_1, job_rows.queue, job_rows.priority, job_rows.max_attempts, job_rows.tags, job_rows.metadata, coalesce(job_rows.scheduled_at, now()) AS coalesce_1, job_rows.sequence_key, job_rows.sequence_key IS NOT NULL AND NOT (job_rows.sequence_key IS NOT NULL AND (row_number() OVER (PARTITION BY job_rows.sequence_key ORDER BY job_rows.ord) > %(param_1)s::INTEGER OR (EXISTS (SELECT *
FROM sa_job AS holder
WHERE holder.sequence_key = job_rows.sequence_key AND holder.sequence_key IS NOT NULL AND holder.sequence_slot)) OR (EXISTS (SELECT *
FROM sa_job AS waiting
WHERE waiting.sequence_key = job_rows.sequence_key AND waiting.sequence_key IS NOT NULL AND waiting.state = 'pending')))) AS anon_2, coalesce(job_rows.sequence_continue_on_cancelled, %(coalesce_3)s) AS coalesce_2, coalesce(job_rows.sequence_continue_on_discarded, %(coalesce_5)s) AS coalesce_4
FROM jsonb_to_recordset(%(sa_jobs_rows)s::JSONB) AS job_rows(ord INTEGER, kind TEXT, args JSONB, queue TEXT, priority SMALLINT, max_attempts SMALLINT, tags TEXT[], metadata JSONB, scheduled_at TIMESTAMP WITH TIME ZONE, unique_key BYTEA, unique_states BIT(8), unique_ttl FLOAT, unique_until_start BOOLEAN, sequence_key BYTEA, sequence_continue_on_cancelled BOOLEAN, sequence_continue_on_discarded BOOLEAN, job_key TEXT)
WHERE (SELECT count(*) AS count_2
FROM sequence_locks) >= %(param_5)s::INTEGER ORDER BY job_rows.ord RETURNING sa_job.id, sa_job.kind, sa_job.state, sa_job.queue, sa_job.priority, sa_job.attempt, sa_job.max_attempts, sa_job.tags, sa_job.scheduled_at, sa_job.attempted_at, sa_job.attempted_by, sa_job.created_at, sa_job.finalized_at, sa_job.run_count, false AS unique_skipped_as_duplicate
