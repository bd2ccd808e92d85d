WITH locked AS
(SELECT sa_job.id AS id
FROM sa_job
WHERE sa_job.state = 'available' AND sa_job.queue = %(fetch_queue)s::VARCHAR AND sa_job.scheduled_at <= now() AND NOT (EXISTS (SELECT *
FROM sa_job_queue
WHERE sa_job_queue.name = %(fetch_queue)s::VARCHAR AND sa_job_queue.paused_at IS NOT NULL)) ORDER BY sa_job.priority, sa_job.scheduled_at, sa_job.id
 LIMIT %(fetch_limit)s::INTEGER FOR UPDATE SKIP LOCKED)
 UPDATE sa_job SET state='running', attempt=(sa_job.attempt + %(attempt_1)s::SMALLINT), attempted_at=now(), attempted_by=array_append(coalesce(sa_job.attempted_by, '{}'::text[]), %(fetch_worker_id)s::VARCHAR), finalized_at=NULL, run_count=(sa_job.run_count + %(run_count_1)s::INTEGER), unique_key=CASE WHEN sa_job.unique_until_start THEN NULL ELSE sa_job.unique_key END WHERE sa_job.id = ANY (CAST((SELECT array_agg(locked.id) AS array_agg_1
FROM locked) AS BIGINT[])) RETURNING sa_job.id, sa_job.kind, sa_job.args, sa_job.state, sa_job.queue, sa_job.priority, sa_job.attempt, sa_job.max_attempts, sa_job.errors, sa_job.metadata, sa_job.tags, sa_job.scheduled_at, sa_job.attempted_at, sa_job.attempted_by, sa_job.created_at, sa_job.finalized_at, sa_job.run_count, sa_job.sequence_key, sa_job.workflow_id
