SELECT min(waiting.id) AS id
FROM sa_job AS waiting
WHERE waiting.sequence_key IS NOT NULL AND waiting.state = 'pending' AND NOT (EXISTS (SELECT *
FROM sa_job AS holder
WHERE holder.sequence_key = waiting.sequence_key AND holder.sequence_key IS NOT NULL AND holder.sequence_slot)) GROUP BY waiting.sequence_key
 LIMIT %(param_1)s::INTEGER
