WITH locked AS
(SELECT sa_job.id AS id, sa_job.kind AS kind, sa_job.priority AS priority, sa_job.scheduled_at AS scheduled_at
FROM sa_job
WHERE sa_job.state = 'available' AND sa_job.queue = %(fetch_queue)s::VARCHAR AND sa_job.scheduled_at <= now() AND NOT (EXISTS (SELECT *
FROM sa_job_queue
WHERE sa_job_queue.name = %(fetch_queue)s::VARCHAR AND sa_job_queue.paused_at IS NOT NULL)) AND sa_job.kind != ALL (%(full_kinds)s::TEXT[]) ORDER BY sa_job.priority, sa_job.scheduled_at, sa_job.id
 LIMIT %(fetch_limit)s::INTEGER FOR UPDATE SKIP LOCKED),
ranked AS
(SELECT locked.id AS id, locked.kind AS kind, row_number() OVER (PARTITION BY locked.kind ORDER BY locked.priority, locked.scheduled_at, locked.id) AS rank
FROM locked),
chosen AS
(SELECT ranked.id AS id
FROM ranked LEFT OUTER JOIN unnest(%(capped_kinds)s::TEXT[], %(kind_caps)s::INTEGER[]) AS caps(kind, cap) ON ranked.kind = caps.kind
WHERE caps.cap IS NULL OR ranked.rank <= caps.cap)
 UPDATE sa_job SET state='running', attempt=(sa_job.attempt + %(attempt_1)s::SMALLINT), attempted_at=%(fetch_at)s::TIMESTAMP WITH TIME ZONE, attempted_by=array_append(coalesce(sa_job.attempted_by, '{}'::text[]), %(fetch_worker_id)s::VARCHAR), finalized_at=NULL, run_count=(sa_job.run_count + %(run_count_1)s::INTEGER), unique_key=CASE WHEN sa_job.unique_until_start THEN NULL ELSE sa_job.unique_key END FROM chosen WHERE sa_job.id = chosen.id RETURNING sa_job.id, sa_job.kind, sa_job.args, sa_job.state, sa_job.queue, sa_job.priority, sa_job.attempt, sa_job.max_attempts, sa_job.errors, sa_job.metadata, sa_job.tags, sa_job.scheduled_at, sa_job.attempted_at, sa_job.attempted_by, sa_job.created_at, sa_job.finalized_at, sa_job.run_count, sa_job.sequence_key, sa_job.workflow_id
