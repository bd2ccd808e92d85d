SELECT sa_job.id
FROM sa_job
WHERE sa_job.state = 'running' AND sa_job.attempted_at < now() - make_interval(%(make_interval_1)s::INTEGER, %(make_interval_2)s::INTEGER, %(make_interval_3)s::INTEGER, %(make_interval_4)s::INTEGER, %(make_interval_5)s::INTEGER, %(make_interval_6)s::INTEGER, %(param_1)s) AND sa_job.attempted_by[cardinality(sa_job.attempted_by)] = %(param_2)s::VARCHAR AND (sa_job.id NOT IN (__[POSTCOMPILE_id_1]))
 LIMIT %(param_3)s::INTEGER
