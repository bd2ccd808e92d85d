WITH steps_seen AS MATERIALIZED
(SELECT sa_job.id AS id, sa_job.xmin AS xmin
FROM sa_job
WHERE sa_job.id = ANY (%(sa_jobs_step_ids)s::BIGINT[])),
finished_jobs AS
(UPDATE sa_job SET state='completed', finalized_at=now(), job_key=NULL FROM unnest(%(sa_jobs_completed_ids)s::BIGINT[], %(sa_jobs_completed_runs)s::INTEGER[]) AS outcome(id, run), steps_seen WHERE sa_job.id = outcome.id AND sa_job.run_count = outcome.run AND CAST(sa_job.state AS TEXT) = 'running' AND sa_job.id = ANY (CAST((SELECT array_agg(outcome.id) AS array_agg_1
FROM unnest(%(sa_jobs_completed_ids)s::BIGINT[], %(sa_jobs_completed_runs)s::INTEGER[]) AS outcome(id, run)) AS BIGINT[])) AND sa_job.id = steps_seen.id AND steps_seen.xmin = sa_job.xmin RETURNING sa_job.id, sa_job.state, sa_job.workflow_id),
resolved_edges AS
(UPDATE sa_job_dep SET resolved=true WHERE NOT sa_job_dep.resolved AND sa_job_dep.depends_on_id = ANY (CAST((SELECT array_agg(finished_jobs.id) AS array_agg_3
FROM finished_jobs
WHERE finished_jobs.workflow_id IS NOT NULL) AS BIGINT[])) RETURNING sa_job_dep.job_id),
resolved_counts AS
(SELECT resolved_edges.job_id AS job_id, count(*) AS n
FROM resolved_edges GROUP BY resolved_edges.job_id),
dependents_locked AS
(SELECT sa_job.id AS id, resolved_counts.n AS n
FROM sa_job JOIN resolved_counts ON sa_job.id = resolved_counts.job_id
WHERE sa_job.id = ANY (CAST((SELECT array_agg(resolved_counts.job_id) AS array_agg_4
FROM resolved_counts) AS BIGINT[])) AND sa_job.state = 'pending' ORDER BY sa_job.id FOR UPDATE OF sa_job),
released_steps AS
(UPDATE sa_job SET state=CAST(CASE WHEN (sa_job.workflow_deps - CAST((SELECT jsonb_object_agg(dependents_locked.id, dependents_locked.n) AS jsonb_object_agg_1
FROM dependents_locked) ->> CAST(sa_job.id AS TEXT) AS BIGINT) > 0) THEN 'pending' ELSE CASE WHEN (sa_job.scheduled_at > clock_timestamp()) THEN 'scheduled' ELSE 'available' END END AS sa_job_state), finalized_at=CASE WHEN (CASE WHEN (sa_job.workflow_deps - CAST((SELECT jsonb_object_agg(dependents_locked.id, dependents_locked.n) AS jsonb_object_agg_1
FROM dependents_locked) ->> CAST(sa_job.id AS TEXT) AS BIGINT) > 0) THEN 'pending' ELSE CASE WHEN (sa_job.scheduled_at > clock_timestamp()) THEN 'scheduled' ELSE 'available' END END IN ('cancelled', 'completed', 'discarded')) THEN now() ELSE NULL END, workflow_deps=(sa_job.workflow_deps - CAST((SELECT jsonb_object_agg(dependents_locked.id, dependents_locked.n) AS jsonb_object_agg_1
FROM dependents_locked) ->> CAST(sa_job.id AS TEXT) AS BIGINT)) WHERE sa_job.id = ANY (CAST((SELECT array_agg(dependents_locked.id) AS array_agg_5
FROM dependents_locked) AS BIGINT[])) AND sa_job.state = 'pending' RETURNING sa_job.state, sa_job.queue),
release_summary AS
(SELECT count(*) FILTER (WHERE released_steps.state != 'pending') AS anon_1, max(CASE WHEN (released_steps.state = 'available') THEN CAST(pg_notify('sa_jobs_insert', released_steps.queue) AS TEXT) END) AS max_1
FROM released_steps),
workflow_deltas AS
(SELECT finished_jobs.workflow_id AS id, -count(*) AS d_unfinished, 0 AS d_failed
FROM finished_jobs
WHERE finished_jobs.workflow_id IS NOT NULL GROUP BY finished_jobs.workflow_id),
workflows_locked AS
(SELECT sa_job_workflow.id AS id
FROM sa_job_workflow JOIN release_summary ON true
WHERE sa_job_workflow.id = ANY (CAST((SELECT array_agg(workflow_deltas.id) AS array_agg_6
FROM workflow_deltas) AS BIGINT[])) ORDER BY sa_job_workflow.id FOR UPDATE OF sa_job_workflow),
workflow_counters AS
(UPDATE sa_job_workflow SET unfinished=(sa_job_workflow.unfinished + workflow_deltas.d_unfinished), failed=(sa_job_workflow.failed + workflow_deltas.d_failed), finished_at=CASE WHEN (sa_job_workflow.unfinished + workflow_deltas.d_unfinished = 0) THEN coalesce(sa_job_workflow.finished_at, now()) ELSE sa_job_workflow.finished_at END FROM workflows_locked, workflow_deltas WHERE sa_job_workflow.id = workflows_locked.id AND sa_job_workflow.id = workflow_deltas.id AND sa_job_workflow.id = ANY (CAST((SELECT array_agg(workflow_deltas.id) AS array_agg_6
FROM workflow_deltas) AS BIGINT[])) RETURNING sa_job_workflow.id, sa_job_workflow.name, sa_job_workflow.total, sa_job_workflow.failed, sa_job_workflow.on_success_job_id, sa_job_workflow.on_complete_job_id, sa_job_workflow.on_failure_job_id, sa_job_workflow.unfinished = 0 AND workflow_deltas.d_unfinished < 0 AS finished_now),
callbacks_cancelled AS
(UPDATE sa_job SET state=CAST('cancelled' AS sa_job_state), finalized_at=CASE WHEN ('cancelled' IN ('cancelled', 'completed', 'discarded')) THEN now() ELSE NULL END WHERE sa_job.id = ANY (CAST((SELECT array_agg(workflow_counters.on_failure_job_id) AS array_agg_2
FROM workflow_counters
WHERE workflow_counters.finished_now AND workflow_counters.failed = 0 AND workflow_counters.on_failure_job_id IS NOT NULL) AS BIGINT[])) AND sa_job.state = 'pending' RETURNING sa_job.id),
callbacks_firing AS
(SELECT workflow_counters.on_complete_job_id AS id, jsonb_build_object('id', workflow_counters.id, 'name', workflow_counters.name, 'total', workflow_counters.total, 'completed', workflow_counters.total - workflow_counters.failed, 'failed', workflow_counters.failed) AS counts
FROM workflow_counters
WHERE workflow_counters.finished_now AND workflow_counters.on_complete_job_id IS NOT NULL UNION ALL SELECT CASE WHEN (workflow_counters.failed > 0) THEN workflow_counters.on_failure_job_id ELSE workflow_counters.on_success_job_id END AS id, jsonb_build_object('id', workflow_counters.id, 'name', workflow_counters.name, 'total', workflow_counters.total, 'completed', workflow_counters.total - workflow_counters.failed, 'failed', workflow_counters.failed) AS counts
FROM workflow_counters
WHERE workflow_counters.finished_now AND CASE WHEN (workflow_counters.failed > 0) THEN workflow_counters.on_failure_job_id ELSE workflow_counters.on_success_job_id END IS NOT NULL),
callbacks_locked AS
(SELECT sa_job.id AS id, callbacks_firing.counts AS counts
FROM sa_job JOIN callbacks_firing ON sa_job.id = callbacks_firing.id
WHERE sa_job.id = ANY (CAST((SELECT array_agg(callbacks_firing.id) AS array_agg_7
FROM callbacks_firing) AS BIGINT[])) AND sa_job.state = 'pending' ORDER BY sa_job.id FOR UPDATE OF sa_job),
callbacks_released AS
(UPDATE sa_job SET state=CAST(CASE WHEN (sa_job.scheduled_at > clock_timestamp()) THEN 'scheduled' ELSE 'available' END AS sa_job_state), metadata=(sa_job.metadata || jsonb_build_object('workflow', callbacks_locked.counts)), finalized_at=CASE WHEN (CASE WHEN (sa_job.scheduled_at > clock_timestamp()) THEN 'scheduled' ELSE 'available' END IN ('cancelled', 'completed', 'discarded')) THEN now() ELSE NULL END FROM callbacks_locked WHERE sa_job.id = callbacks_locked.id AND sa_job.id = ANY (CAST((SELECT array_agg(callbacks_locked.id) AS array_agg_8
FROM callbacks_locked) AS BIGINT[])) AND sa_job.state = 'pending' RETURNING sa_job.state, sa_job.queue),
callbacks_fired AS
(SELECT count(*) AS released, max(CASE WHEN (callbacks_released.state = 'available') THEN CAST(pg_notify('sa_jobs_insert', callbacks_released.queue) AS TEXT) END) AS notified, (SELECT count(*) AS count_1
FROM callbacks_cancelled) AS cancelled
FROM callbacks_released)
 SELECT finished_jobs.id, finished_jobs.state
FROM finished_jobs JOIN callbacks_fired ON true
