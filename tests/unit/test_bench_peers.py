"""bench/peers.py's own logic, without pgqueuer or procrastinate: its options, the virtual
environment it builds (or fails to build, saying why), the peers taking turns, and the
table and ratios it makes of the figures (fake figures here; a real sa_jobs turn is in
tests/integration/test_peers_sa_jobs_turn.py)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "peers.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_peers", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


peers = load()


def turn(rates: dict[str, float], single: float, bulk: float, **extra: float) -> dict[str, Any]:
    return {
        "versions": {"x": "1"},
        "postgresql": "15.0",
        "worked": {k: {"rate": v, "cpu_us": 100.0} for k, v in rates.items()},
        "single": single,
        "bulk": bulk,
        **extra,
    }


def test_the_script_imports_only_the_standard_library() -> None:
    source = SCRIPT.read_text()
    for name in ("sa_jobs", "sqlalchemy", "psycopg", "pgqueuer", "asyncpg", "procrastinate"):
        assert f"import {name}" not in source
        assert f"from {name}" not in source


def test_options_default_to_the_configured_server_without_its_driver(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SA_JOBS_DATABASE_URL", "postgresql+psycopg://u:p@db:5433/admin")
    options = peers.parse_args([])
    assert options.url == "postgresql://u:p@db:5433/admin"
    assert (options.jobs, options.rounds, options.batch) == (20_000, 3, 1_000)
    assert options.slots == [10, 50, 100, 200]
    assert options.peers == ["sa_jobs", "pgqueuer", "procrastinate"]
    assert (options.procrastinate_concurrency, options.procrastinate_jobs) == ([10, 50, 100], 2_000)
    monkeypatch.delenv("SA_JOBS_DATABASE_URL")
    monkeypatch.delenv("DATABASE_URL", raising=False)
    assert peers.parse_args([]).url == peers.LOCAL_URL


@pytest.mark.parametrize(
    "argv",
    [
        ["--pgqueuer-configs", "5"],
        ["--pgqueuer-configs", "0x10"],
        ["--pgqueuer-configs", "axb"],
        ["--jobs", "0"],
        ["--slots", "10", "-1"],
        ["--procrastinate-jobs", "0"],
        ["--procrastinate-concurrency", "10", "0"],
        ["--peers", "celery"],
    ],
)
def test_bad_options_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        peers.parse_args(["--url", "postgresql://h/d", *argv])
    assert raised.value.code == 2
    assert "error" in capsys.readouterr().err


def test_a_url_of_another_database_is_refused() -> None:
    with pytest.raises(SystemExit, match="not a PostgreSQL URL"):
        peers.parse_args(["--url", "mysql://h/d"])


def test_the_table_takes_each_peers_best_setting_by_its_median_over_rounds() -> None:
    summary = peers.summarize(
        {
            # 100 slots has the best single round (9,000) but not the best median.
            "sa_jobs": [
                turn({"10": 3000, "100": 9000}, 1000, 30000, bulk_fast=40000),
                turn({"10": 5000, "100": 4000}, 1200, 32000, bulk_fast=41000),
                turn({"10": 6000, "100": 4500}, 1100, 31000, bulk_fast=42000),
            ],
            "pgqueuer": [
                turn({"1x10": 2000, "5x50": 2500}, 2000, 60000),
                turn({"1x10": 1900, "5x50": 2400}, 2200, 62000),
                turn({"1x10": 2100, "5x50": 2600}, 2200, 61000),
            ],
        }
    )
    ours, theirs = summary["peers"]["sa_jobs"], summary["peers"]["pgqueuer"]
    assert ours["best_setting"] == "10"
    assert ours["figures"] == {"worked": 5000, "single": 1100, "bulk": 31000, "bulk_fast": 41000}
    assert ours["settings"]["100"] == {"median": 4500, "best": 9000, "cpu_us": 100.0}
    assert theirs["best_setting"] == "5x50"
    assert "bulk_fast" not in theirs["figures"]
    assert summary["ratios"] == {
        "pgqueuer": pytest.approx({"worked": 2.0, "single": 0.5, "bulk": 31 / 61})
    }
    assert summary["aim_met"] is True

    table = peers.render(summary)
    assert "2.00x" in table and "0.50x" in table and "sa_jobs/pgqueuer" in table
    assert "sa_jobs/procrastinate" not in table
    assert "aim: sa_jobs worked >= 2x pgqueuer: met (2.00x)" in table
    worked_row = next(line for line in table.splitlines() if line.startswith("worked"))
    assert worked_row.split()[-3:] == ["5,000", "2,500", "2.00x"]
    fast_row = next(line for line in table.splitlines() if "COPY" in line)
    assert fast_row.split()[-2:] == ["41,000", "-"]
    assert "      10       5,000       6,000      100  <- best" in table


def test_below_the_aim_the_table_says_so() -> None:
    summary = peers.summarize(
        {
            "sa_jobs": [turn({"10": 3000}, 1000, 30000)],
            "pgqueuer": [turn({"5x10": 2000}, 1000, 30000)],
        }
    )
    assert summary["aim_met"] is False
    assert "NOT met (1.50x)" in peers.render(summary)


def test_sa_jobs_alone_has_no_ratios() -> None:
    summary = peers.summarize({"sa_jobs": [turn({"10": 3000}, 1000, 30000)]})
    assert summary["ratios"] == {}
    table = peers.render(summary)
    assert "sa_jobs/pgqueuer" not in table and "aim" not in table


def test_procrastinate_gets_its_own_ratios_and_the_aim_stays_pgqueuers() -> None:
    sa_jobs = [turn({"10": 3000}, 1000, 30000)]
    procrastinate = [
        {**turn({"10": 150, "50": 120, "100": 100}, 250, 6000), "jobs": 2000},
    ]
    summary = peers.summarize(
        {
            "sa_jobs": sa_jobs,
            "pgqueuer": [turn({"5x10": 1000}, 500, 60000)],
            "procrastinate": procrastinate,
        }
    )
    assert list(summary["ratios"]) == ["pgqueuer", "procrastinate"]
    assert summary["ratios"]["procrastinate"] == pytest.approx(
        {"worked": 20.0, "single": 4.0, "bulk": 5.0}
    )
    assert summary["aim_met"] is True  # 3x pgqueuer; procrastinate's 20x is not the aim
    assert summary["peers"]["procrastinate"]["best_setting"] == "10"
    table = peers.render(summary)
    worked_row = next(line for line in table.splitlines() if line.startswith("worked"))
    assert worked_row.split()[-5:] == ["3,000", "1,000", "150", "3.00x", "20.00x"]
    assert "sa_jobs/procrastinate" in table
    assert "procrastinate worked jobs/s per setting (2,000 jobs a drain, median of 1" in table
    assert "aim: sa_jobs worked >= 2x pgqueuer: met (3.00x)" in table

    # Without pgqueuer in the run there is no aim to meet, only procrastinate's ratios.
    alone = peers.summarize({"sa_jobs": sa_jobs, "procrastinate": procrastinate})
    assert list(alone["ratios"]) == ["procrastinate"] and "aim_met" not in alone
    assert "aim" not in peers.render(alone)


@pytest.mark.parametrize(("jobs", "cap", "drained"), [(20_000, 2_000, 2_000), (500, 2_000, 500)])
def test_procrastinate_drains_at_most_its_cap_with_its_concurrencies(
    monkeypatch: pytest.MonkeyPatch, jobs: int, cap: int, drained: int
) -> None:
    monkeypatch.setattr(peers, "ensure_venv", lambda venv, requirements: "/venv/bin/python")
    argv = ["--url", "postgresql://h/d", "--jobs", str(jobs), "--procrastinate-jobs", str(cap)]
    argv += ["--procrastinate-concurrency", "10", "30", "--peers", "sa_jobs", "procrastinate"]
    options = peers.parse_args(argv)
    ours, theirs = peers.peers(options)
    assert (ours.jobs, theirs.jobs) == (jobs, drained)
    command = theirs.command(options)
    assert command[1].endswith("bench/peers_procrastinate.py")
    assert command[command.index("--jobs") + 1] == str(drained)
    assert command[command.index("--concurrency") + 1 :] == ["10", "30"]
    assert "PYTHONPATH" not in theirs.env


def test_the_venv_pins_procrastinate_and_the_psycopg_sa_jobs_runs_on() -> None:
    pins = dict(r.split("==") for r in peers.PEER_REQUIREMENTS)
    assert pins["procrastinate"] == "3.10.0" and pins["pgqueuer"] == "1.6.0"
    assert pins["psycopg[binary,pool]"] == "3.3.9"


def test_the_peers_take_turns_round_after_round(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(peers, "ensure_venv", lambda venv, requirements: "/venv/bin/python")
    order: list[tuple[str, str]] = []

    def fake_turn(peer: Any, options: Any) -> dict[str, Any]:
        order.append((peer.name, Path(peer.python).name))
        command = peer.command(options)
        assert command[command.index("--url") + 1] == "postgresql://h/d"
        if peer.name == "sa_jobs":
            assert str(peers.ROOT) in peer.env["PYTHONPATH"].split(":")
            return turn({"10": 4000.0}, 1000, 30000)
        assert "PYTHONPATH" not in peer.env
        if peer.name == "procrastinate":
            assert command[command.index("--concurrency") + 1 :] == ["10", "50", "100"]
            return turn({"10": 200.0}, 400, 8000)
        assert command[command.index("--configs") + 1 :] == ["5x10"]
        return turn({"5x10": 1000.0}, 2000, 60000)

    monkeypatch.setattr(peers, "run_turn", fake_turn)
    out = tmp_path / "peers.json"
    argv = ["--url", "postgresql+psycopg://h/d", "--rounds", "2", "--slots", "10"]
    argv += ["--pgqueuer-configs", "5x10", "--sa-jobs-python", "/sa/python", "--json", str(out)]
    assert peers.main(argv) == 0
    assert order == [("sa_jobs", "python"), ("pgqueuer", "python"), ("procrastinate", "python")] * 2
    report = json.loads(out.read_text())
    assert len(report["turns"]["pgqueuer"]) == 2
    assert report["summary"]["ratios"]["pgqueuer"]["worked"] == 4.0
    assert report["summary"]["ratios"]["procrastinate"]["worked"] == 20.0
    assert report["settings"]["pgqueuer_configs"] == ["5x10"]
    assert report["settings"]["procrastinate_jobs"] == 2_000
    assert report["load_average_start"]


def test_the_venv_is_reused_while_its_pins_hold(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / ".peers-requirements").write_text("pgqueuer==1.6.0\n")
    calls: list[list[str]] = []

    def run(command: list[str], **_: Any) -> None:
        calls.append(command)
        (venv / "bin").mkdir(parents=True, exist_ok=True)

    monkeypatch.setattr(peers.subprocess, "run", run)
    assert peers.ensure_venv(venv, ["pgqueuer==1.6.0"]) == str(venv / "bin" / "python")
    assert calls == []
    peers.ensure_venv(venv, ["pgqueuer==1.7.0"])  # new pins: built again
    assert [c[1:3] for c in calls] == [["-m", "venv"], ["-m", "pip"]]
    assert calls[1][-1] == "pgqueuer==1.7.0"
    assert (venv / ".peers-requirements").read_text() == "pgqueuer==1.7.0\n"


def test_a_venv_that_cannot_be_built_stops_the_run_saying_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def offline(command: list[str], **_: Any) -> None:
        if command[1:3] == ["-m", "pip"]:
            raise subprocess.CalledProcessError(1, command)
        (tmp_path / "venv" / "bin").mkdir(parents=True)

    monkeypatch.setattr(peers.subprocess, "run", offline)
    with pytest.raises(SystemExit, match=r"could not install pgqueuer==1\.6\.0") as raised:
        peers.ensure_venv(tmp_path / "venv", ["pgqueuer==1.6.0"])
    assert "no network" in str(raised.value)
    assert not (tmp_path / "venv").exists()  # no half-built venv taken for a good one
