SELECT fetch_time.at, (SELECT count(*) AS count_1
FROM sa_job
WHERE sa_job.state = 'running' AND sa_job.queue = %(scope_0)s::VARCHAR) AS running_0, (SELECT count(*) AS count_2
FROM sa_job
WHERE sa_job.state = 'running' AND sa_job.kind = %(scope_1)s::VARCHAR) AS running_1, (SELECT coalesce(sum(sa_job_rate_window.starts), %(coalesce_2)s::INTEGER) AS coalesce_1
FROM sa_job_rate_window
WHERE sa_job_rate_window.scope = %(key_1)s::VARCHAR AND sa_job_rate_window.window_end > fetch_time.at - %(per_1)s) AS starts_1
FROM (SELECT clock_timestamp() AS at) AS fetch_time
