"""The long failover run: rounds of ``kill -9`` the primary, promote the standby, under
load, in both replication modes; the figures of docs/operations.md ("Failover").

Each round builds a fresh primary and streaming standby (``tests/failover/cluster.py``,
Debian's PostgreSQL 15 binaries, run as the ``postgres`` OS user when root), starts
``sa-jobs work --processes 2`` and two producer threads on the multi-host URL, lets them
run ``--before`` seconds, kills the primary, promotes the standby ``--outage`` seconds
later, produces ``--after`` more seconds and waits for the queue to drain
(``tests/failover/scenario.py``). It prints one line per round and a summary; with
``--json`` it writes every round's figures.

    python bench/failover.py                          # 3 rounds per mode, ~5 minutes
    python bench/failover.py --rounds 1 --modes sync --outage 10
    python bench/failover.py --json /tmp/failover.json

Run it from the repository's root (it imports ``tests``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1]))

from tests.failover.cluster import Cluster, available
from tests.failover.scenario import run_scenario


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    # A plain SIGTERM would skip the finally blocks and atexit: clusters would be left.
    raise SystemExit(128 + signum)


def main() -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="sync,async", help="sync, async or both")
    parser.add_argument("--before", type=float, default=15.0, help="seconds of load first")
    parser.add_argument("--after", type=float, default=15.0, help="seconds of load after")
    parser.add_argument(
        "--outage", type=float, default=5.0, help="seconds between the kill and the promotion"
    )
    parser.add_argument("--json", type=Path, default=None)
    options = parser.parse_args()
    problem = available()
    if problem:
        print(f"cannot build the clusters: {problem}", file=sys.stderr)
        return 2
    rounds: list[dict[str, Any]] = []
    for mode in options.modes.split(","):
        for number in range(options.rounds):
            cluster = Cluster(synchronous=mode == "sync")
            workdir = Path(tempfile.mkdtemp(prefix="sa_jobs_failover_run_"))
            try:
                findings = run_scenario(
                    cluster,
                    workdir,
                    before=options.before,
                    after=options.after,
                    outage=options.outage,
                    drain_timeout=120.0,
                )
            finally:
                cluster.destroy()
            if findings.drained:
                shutil.rmtree(workdir, ignore_errors=True)
            else:  # the worker's log and the runs, for a look
                print(f"kept {workdir}", file=sys.stderr)
            summary = findings.summary()
            summary["round"] = number + 1
            summary["warning_lines"] = sum(
                " WARNING " in line for line in findings.worker_log.splitlines()
            )
            summary["error_lines"] = sum(
                " ERROR " in line for line in findings.worker_log.splitlines()
            )
            rounds.append(summary)
            print(json.dumps(summary), flush=True)
    print()
    print(
        "| mode | rounds | acknowledged | lost (max) | lost window (max s) | run twice "
        "| resumed after promotion (max s) | NOTIFY wake-up (max s) | WARNING lines (max) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for mode in ("synchronous", "asynchronous"):
        of_mode = [r for r in rounds if r["mode"] == mode]
        if not of_mode:
            continue
        print(
            f"| {mode} | {len(of_mode)} "
            f"| {statistics.mean(r['acknowledged'] for r in of_mode):.0f} "
            f"| {max(r['lost'] for r in of_mode)} "
            f"| {max(r['lost_window_s'] for r in of_mode):.3f} "
            f"| {max(r['jobs_run_twice'] for r in of_mode)} "
            f"| {max(r['resumed_after_promotion_s'] or 99 for r in of_mode):.2f} "
            f"| {max(r['notify_wake_up_s'] or 99 for r in of_mode):.3f} "
            f"| {max(r['warning_lines'] for r in of_mode)} |"
        )
    if options.json:
        options.json.write_text(json.dumps(rounds, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
