WITH due AS
(SELECT sa_job.id AS id
FROM sa_job
WHERE sa_job.state IN ('scheduled', 'retryable') AND sa_job.scheduled_at <= now() ORDER BY sa_job.scheduled_at
 LIMIT %(param_2)s::INTEGER FOR UPDATE SKIP LOCKED),
promoted AS
(UPDATE sa_job SET state='available', finalized_at=NULL FROM due WHERE sa_job.id = due.id RETURNING sa_job.id, sa_job.queue, sa_job.state)
 SELECT promoted.id, promoted.state, CASE WHEN (promoted.state = 'available') THEN CAST(pg_notify(%(param_1)s::VARCHAR, promoted.queue) AS TEXT) END AS anon_1
FROM promoted
