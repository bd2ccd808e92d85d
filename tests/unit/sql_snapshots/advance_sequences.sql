WITH released_slots AS
(UPDATE sa_job SET sequence_slot=%(param_5)s WHERE sa_job.id IN (SELECT unnest(%(sa_jobs_job_ids)s::BIGINT[]) AS unnest_1) AND sa_job.sequence_slot AND (sa_job.state = 'completed' OR sa_job.state = 'cancelled' AND sa_job.sequence_continue_on_cancelled OR sa_job.state = 'discarded' AND sa_job.sequence_continue_on_discarded) RETURNING sa_job.sequence_key),
promoted_in_sequence AS
(UPDATE sa_job SET state=CAST(CASE WHEN (sa_job.scheduled_at > clock_timestamp()) THEN %(param_1)s::VARCHAR ELSE %(param_2)s::VARCHAR END AS sa_job_state), finalized_at=CASE WHEN (CASE WHEN (sa_job.scheduled_at > clock_timestamp()) THEN %(param_1)s::VARCHAR ELSE %(param_2)s::VARCHAR END IN ('cancelled', 'completed', 'discarded')) THEN now() ELSE NULL END, sequence_slot=%(param_3)s WHERE sa_job.id IN (SELECT (SELECT next_pending.id
FROM sa_job AS next_pending
WHERE next_pending.sequence_key = released_slots.sequence_key AND next_pending.sequence_key IS NOT NULL AND next_pending.state = 'pending' ORDER BY next_pending.id
 LIMIT %(param_4)s::INTEGER) AS anon_1
FROM released_slots) RETURNING sa_job.queue, sa_job.state)
 SELECT count(*) AS count_1, max(CASE WHEN (promoted_in_sequence.state = 'available') THEN CAST(pg_notify(%(pg_notify_1)s::VARCHAR, promoted_in_sequence.queue) AS TEXT) END) AS max_1
FROM promoted_in_sequence
