WITH due AS
(SELECT sa_job.id AS id
FROM sa_job
WHERE sa_job.state IN ('scheduled', 'retryable') AND sa_job.scheduled_at <= now() ORDER BY sa_job.scheduled_at
 LIMIT %(param_5)s::INTEGER FOR UPDATE SKIP LOCKED),
taken AS
(SELECT ranked.id AS id, CASE WHEN (ranked.unique_key IS NULL) THEN NULL WHEN ranked.holds THEN NULL WHEN (ranked.id != ranked.first_id) THEN ranked.first_id ELSE (SELECT other.id
FROM sa_job AS other
WHERE other.unique_key = ranked.unique_key AND other.id != ranked.id AND other.unique_key IS NOT NULL AND other.unique_states IS NOT NULL AND sa_job_state_in_bitmask(other.unique_states, other.state)
 LIMIT %(param_4)s::INTEGER) END AS taken_by
FROM (SELECT mine.id AS id, mine.unique_key AS unique_key, mine.unique_key IS NOT NULL AND mine.unique_states IS NOT NULL AND sa_job_state_in_bitmask(mine.unique_states, mine.state) AS holds, first_value(mine.id) OVER (PARTITION BY mine.unique_key, mine.unique_key IS NOT NULL AND mine.unique_states IS NOT NULL AND sa_job_state_in_bitmask(mine.unique_states, mine.state) ORDER BY mine.id) AS first_id
FROM sa_job AS mine, due
WHERE mine.id = due.id) AS ranked),
promoted AS
(UPDATE sa_job SET state=CAST(CASE WHEN (taken.taken_by IS NOT NULL) THEN %(param_2)s::VARCHAR ELSE %(param_3)s::VARCHAR END AS sa_job_state), metadata=CASE WHEN (taken.taken_by IS NOT NULL) THEN sa_job.metadata || jsonb_build_object(%(jsonb_build_object_1)s::VARCHAR, jsonb_build_object(%(jsonb_build_object_2)s::VARCHAR, now(), %(jsonb_build_object_3)s::VARCHAR, taken.taken_by)) ELSE sa_job.metadata END, finalized_at=CASE WHEN (CASE WHEN (taken.taken_by IS NOT NULL) THEN %(param_2)s::VARCHAR ELSE %(param_3)s::VARCHAR END IN ('cancelled', 'completed', 'discarded')) THEN now() ELSE NULL END FROM taken WHERE sa_job.id = taken.id RETURNING sa_job.id, sa_job.queue, sa_job.state)
 SELECT promoted.id, promoted.state, CASE WHEN (promoted.state = 'available') THEN CAST(pg_notify(%(param_1)s::VARCHAR, promoted.queue) AS TEXT) END AS anon_1
FROM promoted
