SELECT count(pg_advisory_xact_lock(%(pg_advisory_xact_lock_1)s::INTEGER, ordered_lock_numbers.n)) AS count_1
FROM (SELECT lock_numbers.n AS n
FROM unnest(%(lock_numbers)s::INTEGER[]) AS lock_numbers(n) ORDER BY lock_numbers.n) AS ordered_lock_numbers
