"""Maintenance: work that keeps the table healthy, run by one elected worker process.

Every process heartbeats (:mod:`.presence`); one of them, the leader (:mod:`.leader`),
also runs the scheduler, the rescuer and the cleaner. Each service is a small class with
``run_once(connection) -> int`` so a test can call it directly, without a loop.
"""
