"""What a benchmark run found: figures with their floors and ratios, as text and JSON."""

from __future__ import annotations

import contextlib
import os
import platform
from typing import Any

import attrs

__all__ = ["JSON_FORMAT", "Figure", "Report", "environment"]

#: Bumped when the JSON document changes incompatibly.
JSON_FORMAT = 1


@attrs.frozen
class Figure:
    """One measured figure, and the floor's for the same work in the same run.

    Attributes:
        key: A stable name for scripts (``worked``, ``latency_p50`` …).
        label: What was measured, for people.
        unit: ``jobs/s``, ``us`` or ``ms``.
        sa_jobs: sa_jobs' figure.
        floor: The floor's figure, or ``None`` without ``--floor``.
        higher_is_better: Rates are; CPU time and latency are not.
    """

    key: str
    label: str
    unit: str
    sa_jobs: float
    floor: float | None = None
    higher_is_better: bool = True

    @property
    def ratio(self) -> float | None:
        """sa_jobs' figure divided by the floor's (``None`` without a floor)."""
        if self.floor is None or self.floor <= 0:
            return None
        return self.sa_jobs / self.floor

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "label": self.label,
            "unit": self.unit,
            "sa_jobs": self.sa_jobs,
            "floor": self.floor,
            "ratio": self.ratio,
            "higher_is_better": self.higher_is_better,
        }


@attrs.define
class Report:
    """The settings of a run, where it ran, and its figures in the order measured."""

    settings: dict[str, Any]
    environment: dict[str, str]
    figures: list[Figure] = attrs.field(factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "format": JSON_FORMAT,
            "settings": self.settings,
            "environment": self.environment,
            "figures": [figure.as_dict() for figure in self.figures],
        }

    def render(self) -> str:
        """A plain-text table, one figure a line; the ratio column only with a floor."""
        with_floor = any(figure.floor is not None for figure in self.figures)
        header = ["", "sa_jobs"] + (["floor", "ratio"] if with_floor else [])
        rows = [header]
        for figure in self.figures:
            row = [figure.label, f"{_number(figure.sa_jobs)} {figure.unit}"]
            if with_floor:
                floor = figure.floor
                row.append("-" if floor is None else f"{_number(floor)} {figure.unit}")
                ratio = figure.ratio
                row.append("-" if ratio is None else f"{ratio:.2f}x")
            rows.append(row)
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines = [
            "  ".join(
                cell.ljust(width) if i == 0 else cell.rjust(width)
                for i, (cell, width) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
            for row in rows
        ]
        if with_floor:
            lines.append(
                "ratio = sa_jobs / floor, both measured in this run; rates: higher is better, "
                "CPU and latency: lower is better"
            )
        return "\n".join(lines)


def _number(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def environment() -> dict[str, str]:
    """Where the run happened: CPUs, memory, load, and the versions that matter."""
    import psycopg
    import sqlalchemy

    import sa_jobs

    found = {
        "cpus": str(os.cpu_count()),
        "cpu": "unknown",
        "memory": "unknown",
        "load_average": "unknown",
        "python": platform.python_version(),
        "platform": platform.platform(),
        "sa_jobs": sa_jobs.__version__,
        "sqlalchemy": sqlalchemy.__version__,
        "psycopg": psycopg.__version__,
    }
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                found["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError), open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal"):
                found["memory"] = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                break
    with contextlib.suppress(OSError), open("/proc/loadavg") as loadavg:
        found["load_average"] = " ".join(loadavg.read().split()[:3])
    return found
