SELECT sa_job.id
FROM sa_job
WHERE sa_job.state = 'running' AND sa_job.attempted_at < now() - make_interval(%(make_interval_1)s::INTEGER, %(make_interval_2)s::INTEGER, %(make_interval_3)s::INTEGER, %(make_interval_4)s::INTEGER, %(make_interval_5)s::INTEGER, %(make_interval_6)s::INTEGER, %(param_1)s) AND NOT (EXISTS (SELECT *
FROM sa_job_worker
WHERE sa_job_worker.id = sa_job.attempted_by[cardinality(sa_job.attempted_by)] AND sa_job_worker.heartbeat_at > now() - make_interval(%(make_interval_7)s::INTEGER, %(make_interval_8)s::INTEGER, %(make_interval_9)s::INTEGER, %(make_interval_10)s::INTEGER, %(make_interval_11)s::INTEGER, %(make_interval_12)s::INTEGER, %(param_2)s)))
 LIMIT %(param_3)s::INTEGER
