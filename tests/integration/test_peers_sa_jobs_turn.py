"""bench/peers.py for real, sa_jobs' side only (pgqueuer is not installed by the test
suite): one tiny turn on a throwaway database, through the same subprocess the script
runs, and the figures it reports back."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sa_jobs.devdb import Server
from tests.unit.test_bench_peers import peers


@pytest.mark.slow
def test_a_tiny_sa_jobs_turn_drains_its_jobs_and_reports(
    pg_server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "peers.json"
    url = pg_server.url.render_as_string(hide_password=False)
    argv = ["--peers", "sa_jobs", "--url", url, "--sa-jobs-python", sys.executable]
    argv += ["--jobs", "300", "--singles", "10", "--batch", "100", "--rounds", "1"]
    argv += ["--slots", "10", "50", "--json", str(out)]
    assert peers.main(argv) == 0

    report = json.loads(out.read_text())
    (result,) = report["turns"]["sa_jobs"]
    assert set(result["worked"]) == {"10", "50"}
    assert all(figures["rate"] > 0 for figures in result["worked"].values())
    assert result["single"] > 0 and result["bulk"] > 0 and result["bulk_fast"] > 0
    assert result["versions"]["sa_jobs"]
    summary = report["summary"]["peers"]["sa_jobs"]
    assert summary["best_setting"] in ("10", "50")
    printed = capsys.readouterr().out
    assert "worked no-op jobs/s, best setting" in printed
