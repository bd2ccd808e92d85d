"""Maintenance: work that keeps the table healthy.

Every process heartbeats (:mod:`.heartbeat`), rescues its own lost jobs and looks for
cancel requests it missed (:mod:`.missed_cancels`); one of them, the leader
(:mod:`.leader`), also runs the scheduler, the rescuer, the cleaner and the sequence
repair. :mod:`.loop` runs them all on one thread. Each service is a small class with
``run_once(connection) -> int`` so a test can call it directly, without a loop.
"""
