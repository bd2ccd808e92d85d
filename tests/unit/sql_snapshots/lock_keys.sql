SELECT count(pg_advisory_xact_lock(%(pg_advisory_xact_lock_1)s::INTEGER, lock_numbers.n)) AS count_1
FROM unnest(%(sa_jobs_sequence_locks)s::INTEGER[]) AS lock_numbers(n)
