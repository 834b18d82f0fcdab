-- Per queue: attempts ended by the reaper, and failed or expired attempts
-- after which the job was queued again (retries).
-- No parameters.
-- Index: none (a scan of job_attempts joined to jobs by primary key).
-- Locking: none.
SELECT j.queue,
       count(*) FILTER (WHERE a.outcome = 'lease_expired')::bigint AS lease_expiries,
       count(*) FILTER (WHERE a.outcome IN ('failed', 'lease_expired')
                          AND a.state_after = 'queued')::bigint AS retries
FROM job_attempts a
JOIN jobs j ON j.id = a.job_id
GROUP BY j.queue
