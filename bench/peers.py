"""sa_jobs against its Python peers pgqueuer and procrastinate, side by side on one
server, in one run.

Issue 28 aims at worked no-op jobs/s, one worker process at its best concurrency, of at
least twice pgqueuer's in the same run; its table also measured procrastinate. This
script measures, for each peer, on a throwaway database of its own (created on
``--url``'s server, dropped at the end):

* worked no-op jobs/s: ``--jobs`` jobs drained by one worker process, for each of the
  peer's concurrency settings (sa_jobs: ``queues={"default": N}`` for N in ``--slots``;
  pgqueuer: ``M`` QueueManagers of ``batch_size=B`` for each ``MxB`` in
  ``--pgqueuer-configs``; procrastinate: ``run_worker(concurrency=N)`` for N in
  ``--procrastinate-concurrency``, draining at most ``--procrastinate-jobs``, as it works
  a few hundred jobs/s at most); the best setting's median is the peer's figure;
* single enqueue/s, one transaction a job (``--singles`` of them);
* bulk enqueue/s, ``--batch`` jobs a transaction (the jobs then drained).

What each side runs, and why the settings are fair: ``bench/peers_sa_jobs.py``,
``bench/peers_pgqueuer.py``, ``bench/peers_procrastinate.py``, and docs/performance.md
("Against the Python peers").

Each peer's code runs in a subprocess of its own Python, never in this one (which needs
only the standard library):

* sa_jobs: ``--sa-jobs-python`` (default: the checkout's ``.venv`` when there is one,
  else the interpreter running this script), with the checkout first on ``PYTHONPATH``,
  so the working tree's sa_jobs is measured;
* pgqueuer and procrastinate: ``.venv-peers/`` (``--venv``), made here with pinned
  versions of pgqueuer, asyncpg, procrastinate and psycopg, and rebuilt only when the
  pins change. Neither is a dependency of sa_jobs, not even a dev one
  (docs/dev/decisions.md, "The peers' benchmark").

The peers take turns, round after round (A B C A B C ...), so the machine's drift is
shared. Printed: each figure's median over the rounds, each concurrency setting's median,
and the ratios sa_jobs / each peer; ``--json`` writes all of it with every round's figures.

    python bench/peers.py                             # 20,000 jobs (procrastinate 2,000), 3 rounds
    python bench/peers.py --jobs 10000 --rounds 5 --json peers.json
    python bench/peers.py --peers sa_jobs procrastinate --jobs 5000 --rounds 1
    python bench/peers.py --peers sa_jobs --jobs 500  # sa_jobs alone (no venv needed)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
#: The peers' virtual environment (git-ignored, as every ``.venv-*``).
VENV = ROOT / ".venv-peers"
#: What is installed into it. pgqueuer brings uvloop, which its worker runs on.
#: procrastinate asks for ``psycopg[pool]`` unpinned, i.e. psycopg's pure-Python build on
#: the system's libpq; the pins give it the psycopg sa_jobs' own venv has (3.3.9, binary),
#: so the drivers of the two psycopg-based sides do not differ.
PEER_REQUIREMENTS = (
    "pgqueuer==1.6.0",
    "asyncpg==0.32.0",
    "procrastinate==3.10.0",
    "psycopg[binary,pool]==3.3.9",
    "psycopg-pool==3.3.3",
)
LOCAL_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
#: The issue's aim: sa_jobs' worked jobs/s at least this many times pgqueuer's.
AIM = 2.0
PEERS = ("sa_jobs", "pgqueuer", "procrastinate")
#: The peers sa_jobs' figures are divided by, in the table's order.
OTHERS = ("pgqueuer", "procrastinate")


@dataclass(frozen=True)
class Peer:
    name: str
    script: Path
    python: str
    #: Jobs drained per setting (and enqueued per bulk fill).
    jobs: int
    #: The command-line options naming its concurrency settings.
    settings: tuple[str, ...]
    env: dict[str, str]

    def command(self, options: argparse.Namespace) -> list[str]:
        return [
            self.python,
            str(self.script),
            "--url",
            options.url,
            "--jobs",
            str(self.jobs),
            "--singles",
            str(options.singles),
            "--batch",
            str(options.batch),
            *self.settings,
        ]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url",
        default=None,
        help="a server's admin database (default: $SA_JOBS_DATABASE_URL, $DATABASE_URL, "
        f"else {LOCAL_URL}); databases are created and dropped on it",
    )
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs drained per setting")
    parser.add_argument("--singles", type=int, default=1_000, help="single enqueues per turn")
    parser.add_argument("--batch", type=int, default=1_000, help="jobs per bulk transaction")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--slots", type=int, nargs="+", default=[10, 50, 100, 200], help="sa_jobs' concurrencies"
    )
    parser.add_argument(
        "--pgqueuer-configs",
        nargs="+",
        default=["1x10", "5x10", "5x50", "5x100"],
        help="pgqueuer's settings, MANAGERSxBATCH_SIZE",
    )
    parser.add_argument(
        "--procrastinate-concurrency",
        type=int,
        nargs="+",
        default=[10, 50, 100],
        help="procrastinate's worker concurrencies (its pool: one connection more)",
    )
    parser.add_argument(
        "--procrastinate-jobs",
        type=int,
        default=2_000,
        help="procrastinate drains the smaller of this and --jobs per setting",
    )
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS))
    parser.add_argument("--sa-jobs-python", default=None, help="the interpreter for sa_jobs")
    parser.add_argument("--venv", type=Path, default=VENV, help="the peers' virtual environment")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    options = parser.parse_args(argv)
    options.url = libpq_url(options.url or default_url())
    for config in options.pgqueuer_configs:
        managers, _, batch = config.lower().partition("x")
        if not (managers.isdigit() and batch.isdigit() and int(managers) and int(batch)):
            parser.error(f"--pgqueuer-configs: {config!r} is not MANAGERSxBATCH_SIZE, e.g. 5x10")
    counts = (options.jobs, options.singles, options.batch, options.rounds, *options.slots)
    if min(*counts, options.procrastinate_jobs, *options.procrastinate_concurrency) < 1:
        parser.error(
            "--jobs, --singles, --batch, --rounds, --slots and the --procrastinate-* "
            "options must be positive"
        )
    return options


def default_url() -> str:
    for variable in ("SA_JOBS_DATABASE_URL", "DATABASE_URL"):
        if os.environ.get(variable):
            return os.environ[variable]
    return LOCAL_URL


def libpq_url(url: str) -> str:
    """The URL without an SQLAlchemy driver (``postgresql+psycopg://`` ->
    ``postgresql://``): each side adds its own driver (asyncpg takes only this form)."""
    parts = urlsplit(url)
    scheme = parts.scheme.split("+", 1)[0]
    if scheme not in ("postgresql", "postgres"):
        raise SystemExit(f"--url: not a PostgreSQL URL: {url!r}")
    return urlunsplit(parts._replace(scheme="postgresql"))


def sa_jobs_python(option: str | None) -> str:
    if option:
        return option
    own = ROOT / ".venv" / "bin" / "python"
    return str(own) if own.exists() else sys.executable


def pip_install(python: Path) -> list[str]:
    return [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]


def ensure_venv(venv: Path, requirements: Sequence[str]) -> str:
    """``venv``'s Python, with ``requirements`` installed; built (again) only when the
    pins written into it differ. Exits with a message saying what failed."""
    python = venv / "bin" / "python"
    stamp = venv / ".peers-requirements"
    wanted = "\n".join(requirements) + "\n"
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return str(python)
    print(f"building {venv} with {' '.join(requirements)}", flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    except (OSError, subprocess.CalledProcessError) as error:
        raise SystemExit(
            f"could not make the virtual environment {venv} with {sys.executable} ({error}); "
            "the venv module needs ensurepip (Debian: apt-get install python3-venv)"
        ) from None
    try:
        subprocess.run(
            [*pip_install(python), *requirements],
            check=True,
        )
    except (OSError, subprocess.CalledProcessError) as error:
        shutil.rmtree(venv, ignore_errors=True)
        raise SystemExit(
            f"could not install {' '.join(requirements)} into {venv} ({error}): pip's "
            "output above says why; without a package index (no network) the peers cannot "
            "be measured. `--peers sa_jobs` runs sa_jobs' side alone."
        ) from None
    stamp.write_text(wanted)
    return str(python)


def peer(name: str, options: argparse.Namespace) -> Peer:
    """``name``'s side: its script, interpreter, jobs a drain, settings and environment."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    script = BENCH / f"peers_{name}.py"
    if name == "sa_jobs":
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        python = sa_jobs_python(options.sa_jobs_python)
        settings = ("--slots", *map(str, options.slots))
        return Peer(name, script, python, options.jobs, settings, {**env, "PYTHONPATH": path})
    python = ensure_venv(options.venv, PEER_REQUIREMENTS)
    if name == "pgqueuer":
        return Peer(
            name, script, python, options.jobs, ("--configs", *options.pgqueuer_configs), env
        )
    jobs = min(options.jobs, options.procrastinate_jobs)
    settings = ("--concurrency", *map(str, options.procrastinate_concurrency))
    return Peer(name, script, python, jobs, settings, env)


def peers(options: argparse.Namespace) -> list[Peer]:
    return [peer(name, options) for name in options.peers]


def run_turn(peer: Peer, options: argparse.Namespace) -> dict[str, Any]:
    """One turn of a peer: its side script in its own Python; the JSON it prints last."""
    completed = subprocess.run(
        peer.command(options), env=peer.env, cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    if completed.returncode != 0:
        raise SystemExit(f"{peer.name}'s turn failed (exit {completed.returncode}); see above")
    lines = completed.stdout.strip().splitlines()
    return dict(json.loads(lines[-1]))


# ----------------------------------------------------------------------------- report


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def summarize(turns: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians over the rounds per peer and figure, the best setting, and the ratios."""
    summary: dict[str, Any] = {"peers": {}, "ratios": {}}
    for name, results in turns.items():
        settings = list(results[0]["worked"])
        worked = {
            setting: {
                "median": median([r["worked"][setting]["rate"] for r in results]),
                "best": max(r["worked"][setting]["rate"] for r in results),
                "cpu_us": median([r["worked"][setting]["cpu_us"] for r in results]),
            }
            for setting in settings
        }
        best = max(settings, key=lambda setting: worked[setting]["median"])
        figures = {
            "worked": worked[best]["median"],
            "single": median([r["single"] for r in results]),
            "bulk": median([r["bulk"] for r in results]),
        }
        if all("bulk_fast" in r for r in results):
            figures["bulk_fast"] = median([r["bulk_fast"] for r in results])
        summary["peers"][name] = {
            "best_setting": best,
            "figures": figures,
            "settings": worked,
            "rounds": len(results),
            "jobs": results[0].get("jobs"),
            "versions": results[0]["versions"],
        }
    if "sa_jobs" in turns:
        ours = summary["peers"]["sa_jobs"]["figures"]
        for other in (name for name in OTHERS if name in turns):
            theirs = summary["peers"][other]["figures"]
            summary["ratios"][other] = {
                key: ours[key] / theirs[key] for key in ("worked", "single", "bulk")
            }
    if "pgqueuer" in summary["ratios"]:
        summary["aim_met"] = summary["ratios"]["pgqueuer"]["worked"] >= AIM
    return summary


ROWS = (
    ("worked", "worked no-op jobs/s, best setting"),
    ("single", "single enqueue/s (1 tx each)"),
    ("bulk", "bulk enqueue/s (1 tx per batch)"),
    ("bulk_fast", "  sa_jobs insert_many_fast (COPY)"),
)


def render(summary: dict[str, Any]) -> str:
    names = list(summary["peers"])
    ratios = summary["ratios"]
    header = f"{'':34}" + "".join(f"{name:>16}" for name in names)
    header += "".join(f"{'sa_jobs/' + other:>23}" for other in ratios)
    lines = [header, "-" * len(header)]
    for key, label in ROWS:
        cells = []
        for name in names:
            value = summary["peers"][name]["figures"].get(key)
            cells.append(f"{'-' if value is None else f'{value:,.0f}':>16}")
        if not any(cell.strip() != "-" for cell in cells):
            continue
        shown = [f"{ratio[key]:.2f}x" if key in ratio else "" for ratio in ratios.values()]
        lines.append(f"{label:34}" + "".join(cells) + "".join(f"{s:>23}" for s in shown))
    lines.append("")
    for name in names:
        peer = summary["peers"][name]
        jobs = f"{peer['jobs']:,} jobs a drain, " if peer.get("jobs") else ""
        lines.append(
            f"{name} worked jobs/s per setting ({jobs}median of {peer['rounds']}, best, "
            "worker CPU us/job):"
        )
        for setting, figures in peer["settings"].items():
            mark = "  <- best" if setting == peer["best_setting"] else ""
            lines.append(
                f"  {setting:>6}  {figures['median']:>10,.0f}  {figures['best']:>10,.0f}"
                f"  {figures['cpu_us']:>7.0f}{mark}"
            )
    if "aim_met" in summary:
        verdict = "met" if summary["aim_met"] else "NOT met"
        shown = f"{ratios['pgqueuer']['worked']:.2f}x"
        lines.append(f"\naim: sa_jobs worked >= {AIM:.0f}x pgqueuer: {verdict} ({shown})")
    return "\n".join(lines)


def load_average() -> str:
    try:
        with open("/proc/loadavg") as file:
            return " ".join(file.read().split()[:3])
    except OSError:
        return "unknown"


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    chosen = peers(options)
    report: dict[str, Any] = {
        "command": " ".join(
            ["python", "bench/peers.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "load_average_start": load_average(),
        "settings": {
            "jobs": options.jobs,
            "singles": options.singles,
            "batch": options.batch,
            "rounds": options.rounds,
            "slots": options.slots,
            "pgqueuer_configs": options.pgqueuer_configs,
            "procrastinate_concurrency": options.procrastinate_concurrency,
            "procrastinate_jobs": min(options.jobs, options.procrastinate_jobs),
        },
    }
    print(f"load average at start: {report['load_average_start']}; {os.cpu_count()} CPUs")
    turns: dict[str, list[dict[str, Any]]] = {peer.name: [] for peer in chosen}
    started = time.perf_counter()
    for round_ in range(options.rounds):
        for peer in chosen:
            print(f"round {round_ + 1}/{options.rounds}: {peer.name}", flush=True)
            turns[peer.name].append(run_turn(peer, options))
    report["load_average_end"] = load_average()
    report["seconds"] = round(time.perf_counter() - started)
    report["postgresql"] = next(iter(turns.values()))[0]["postgresql"]
    report["turns"] = turns
    report["summary"] = summary = summarize(turns)
    print(f"\nload average at end: {report['load_average_end']}; PostgreSQL {report['postgresql']}")
    for name, peer in summary["peers"].items():
        print(f"{name}: {', '.join(f'{k} {v}' for k, v in peer['versions'].items())}")
    print()
    print(render(summary))
    if options.json:
        options.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {options.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
