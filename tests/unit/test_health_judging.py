"""Judging the health figures without a database: the thresholds, each kind of holder
(prepared transactions and replication slots included, which the test server cannot
make), and the duration syntax of ``sa-jobs health``."""

from __future__ import annotations

import argparse
import datetime as dt

import pytest

from sa_jobs._inspect.health import HealthLevel, HealthThresholds, evaluate
from sa_jobs._inspect.horizon import DeadTuples, HolderKind, HorizonHolder, vacuum_trigger
from sa_jobs.cli.settings import duration
from sa_jobs.errors import InvalidOptionsError

MINUTE = dt.timedelta(minutes=1)
DEFAULTS = HealthThresholds()


def holder(
    kind: HolderKind, *, xids: int = 10, age: dt.timedelta | None = None, name: str = "x"
) -> HorizonHolder:
    return HorizonHolder(kind, name, xids, age, "")


def dead(n: int, *, live: int = 1000, scale_factor: float | None = 0.01) -> DeadTuples:
    """``sa_job`` with ``n`` dead rows; autovacuum as the schema sets it (1 %, the
    server's threshold of 50), or off with ``scale_factor=None``."""
    return DeadTuples(
        live=live,
        dead=n,
        last_vacuum=None,
        last_autovacuum=None,
        vacuum_count=0,
        autovacuum_count=0,
        vacuum_trigger=None if scale_factor is None else 50 + round(scale_factor * live),
    )


def test_nothing_held_and_few_dead_rows_is_ok() -> None:
    assert evaluate([], dead(10), DEFAULTS) == (HealthLevel.OK, ())


@pytest.mark.parametrize(
    ("age", "level"),
    [
        (4 * MINUTE, HealthLevel.OK),
        (5 * MINUTE, HealthLevel.WARNING),
        (30 * MINUTE, HealthLevel.CRITICAL),
    ],
)
def test_an_open_transaction_is_judged_by_its_age(age: dt.timedelta, level: HealthLevel) -> None:
    found, findings = evaluate(
        [holder(HolderKind.TRANSACTION, age=age, name="pid 7")], None, DEFAULTS
    )
    assert found is level
    assert [f.figure for f in findings] == ([] if level is HealthLevel.OK else ["xmin_age"])


def test_a_prepared_transaction_is_judged_by_its_age_and_says_how_to_end_it() -> None:
    found, (finding,) = evaluate(
        [holder(HolderKind.PREPARED, age=40 * MINUTE, name="tx-1")], None, DEFAULTS
    )
    assert found is HealthLevel.CRITICAL
    assert "ROLLBACK PREPARED 'tx-1'" in finding.message


def test_a_replication_slot_has_no_age_and_is_judged_by_transaction_ids() -> None:
    found, (finding,) = evaluate(
        [holder(HolderKind.SLOT, xids=300_000, name="standby")], None, DEFAULTS
    )
    assert found is HealthLevel.WARNING
    assert finding.figure == "xmin_xids"
    assert "pg_drop_replication_slot('standby')" in finding.message


def test_a_slots_catalog_xmin_keeps_no_job_rows_and_never_raises_the_level() -> None:
    found = evaluate([holder(HolderKind.SLOT_CATALOG, xids=10**8)], None, DEFAULTS)
    assert found == (HealthLevel.OK, ())


def test_dead_rows_past_the_thresholds() -> None:
    assert evaluate([], dead(200_000), DEFAULTS)[0] is HealthLevel.WARNING
    assert evaluate([], dead(1_000_000), DEFAULTS)[0] is HealthLevel.CRITICAL
    assert evaluate([], dead(200_000, scale_factor=None), DEFAULTS)[0] is HealthLevel.WARNING


def test_dead_rows_are_judged_against_autovacuums_trigger_on_a_big_table() -> None:
    # 50M live rows at scale factor 0.01: autovacuum starts at 500,050 dead, so 400,000
    # is a vacuum not yet due, not a warning (a probe would flap on every busy table).
    assert evaluate([], dead(400_000, live=50_000_000), DEFAULTS) == (HealthLevel.OK, ())
    level, (finding,) = evaluate([], dead(1_100_000, live=50_000_000), DEFAULTS)
    assert level is HealthLevel.WARNING  # past twice the trigger
    assert "autovacuum starts at 500,050" in finding.message
    assert evaluate([], dead(2_600_000, live=50_000_000), DEFAULTS)[0] is HealthLevel.CRITICAL


def test_the_autovacuum_trigger_comes_from_the_tables_options_then_the_server() -> None:
    server = {"autovacuum": "on", "threshold": "50", "scale_factor": "0.2"}
    assert vacuum_trigger(1_000_000, None, server) == 200_050
    assert vacuum_trigger(1_000_000, ["autovacuum_vacuum_scale_factor=0.01"], server) == 10_050
    table = ["autovacuum_vacuum_threshold=1000", "autovacuum_vacuum_scale_factor=0"]
    assert vacuum_trigger(1_000_000, table, server) == 1000
    assert vacuum_trigger(1_000_000, ["autovacuum_enabled=false"], server) is None
    assert vacuum_trigger(1_000_000, None, server | {"autovacuum": "off"}) is None


def test_the_worst_finding_comes_first() -> None:
    level, findings = evaluate(
        [holder(HolderKind.TRANSACTION, age=6 * MINUTE)], dead(2_000_000), DEFAULTS
    )
    assert level is HealthLevel.CRITICAL
    assert [f.level for f in findings] == [HealthLevel.CRITICAL, HealthLevel.WARNING]


def test_the_oldest_running_transaction_stands_in_for_invisible_sessions() -> None:
    level, (finding,) = evaluate([], None, DEFAULTS, oldest_xid_age=2_000_000)
    assert level is HealthLevel.CRITICAL
    assert "pg_monitor" in finding.message


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"xmin_age_warning": dt.timedelta(0)}, "xmin_age_warning: must be a positive"),
        ({"dead_tuples_critical": 0}, "dead_tuples_critical: must be a whole number"),
        ({"xmin_xids_warning": 5, "xmin_xids_critical": 4}, "a warning comes first"),
        ({"xmin_age_warning": 5}, "must be a positive timedelta"),
    ],
)
def test_bad_thresholds_are_refused_when_built(options: dict[str, object], fragment: str) -> None:
    with pytest.raises(InvalidOptionsError, match=fragment):
        HealthThresholds(**options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        ("90s", 90),
        ("5m", 300),
        ("1.5h", 5400),
        ("0.5s", 0.5),
        ("1d", 86_400),
        ("2w", 1_209_600),
        (" 7D ", 604_800),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    # The one duration syntax of every command (stats' thresholds, the bulk filters' ages).
    assert duration(text) == dt.timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "0", "5 minutes", "-1s", "1y", "s"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="not a duration"):
        duration(text)
