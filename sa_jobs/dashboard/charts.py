"""The overview's charts of the last hour, drawn on the server as SVG geometry.

No JavaScript and no chart library: :func:`hour_chart` turns sixty
:class:`~sa_jobs.dashboard.queries.Minute` values into rectangles and a polyline that the
template writes out as inline SVG, with a ``<title>`` per bar for the hover text;
:func:`sparkline` makes each queue's small one.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from sa_jobs.dashboard.queries import Minute

__all__ = ["Bar", "Chart", "Sparkline", "hour_chart", "sparkline"]

WIDTH = 720
HEIGHT = 180
#: Room for the axis labels.
LEFT = 48
RIGHT = 56
TOP = 10
BOTTOM = 22


@attrs.frozen
class Bar:
    x: float
    width: float
    #: The completed part (bottom) and the discarded part stacked on it.
    completed_y: float
    completed_height: float
    discarded_y: float
    discarded_height: float
    title: str


@attrs.frozen
class Chart:
    width: int
    height: int
    left: int
    right: int
    top: int
    bottom: int
    bars: Sequence[Bar]
    #: SVG polyline points of the mean wait (scheduled → started), or "" without data.
    wait_points: str
    max_jobs: int
    max_wait: float
    total_completed: int
    total_discarded: int


def hour_chart(minutes: Sequence[Minute]) -> Chart:
    plot_width = WIDTH - LEFT - RIGHT
    plot_height = HEIGHT - TOP - BOTTOM
    base = TOP + plot_height
    slot = plot_width / max(len(minutes), 1)
    max_jobs = max([m.completed + m.discarded for m in minutes] + [1])
    waits = [m.wait for m in minutes if m.wait is not None]
    max_wait = max([*waits, 0.001])
    bars = []
    points = []
    for index, minute in enumerate(minutes):
        x = LEFT + index * slot
        completed_height = plot_height * minute.completed / max_jobs
        discarded_height = plot_height * minute.discarded / max_jobs
        title = f"{minute.start:%H:%M} UTC: {minute.completed} completed"
        if minute.discarded:
            title += f", {minute.discarded} discarded"
        if minute.wait is not None:
            title += f"; mean wait {format_seconds(minute.wait)}"
        if minute.run is not None:
            title += f", mean run {format_seconds(minute.run)}"
        bars.append(
            Bar(
                x=round(x + 1, 1),
                width=round(max(slot - 2, 1), 1),
                completed_y=round(base - completed_height, 1),
                completed_height=round(completed_height, 1),
                discarded_y=round(base - completed_height - discarded_height, 1),
                discarded_height=round(discarded_height, 1),
                title=title,
            )
        )
        if minute.wait is not None:
            y = base - plot_height * minute.wait / max_wait
            points.append(f"{x + slot / 2:.1f},{y:.1f}")
    return Chart(
        width=WIDTH,
        height=HEIGHT,
        left=LEFT,
        right=RIGHT,
        top=TOP,
        bottom=BOTTOM,
        bars=bars,
        wait_points=" ".join(points),
        max_jobs=max_jobs,
        max_wait=max_wait,
        total_completed=sum(m.completed for m in minutes),
        total_discarded=sum(m.discarded for m in minutes),
    )


SPARK_WIDTH = 90
SPARK_HEIGHT = 24


@attrs.frozen
class Sparkline:
    """A queue's hour in a table cell: one bar per minute of jobs finished."""

    width: int
    height: int
    #: (x, y, height) of each non-empty minute's bar; every bar is one slot wide.
    bars: Sequence[tuple[float, float, float]]
    slot: float
    max_jobs: int


def sparkline(minutes: Sequence[Minute]) -> Sparkline:
    slot = SPARK_WIDTH / max(len(minutes), 1)
    max_jobs = max([m.completed + m.discarded for m in minutes] + [1])
    bars = []
    for index, minute in enumerate(minutes):
        jobs = minute.completed + minute.discarded
        if jobs:
            height = max(SPARK_HEIGHT * jobs / max_jobs, 1.0)
            bars.append((round(index * slot, 1), round(SPARK_HEIGHT - height, 1), round(height, 1)))
    return Sparkline(SPARK_WIDTH, SPARK_HEIGHT, bars, round(slot, 2), max_jobs)


def format_seconds(value: float) -> str:
    """A duration for people: ``850 ms``, ``12.3 s``, ``4 min``, ``3 h``, ``2 d``."""
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 60:
        return f"{value:.1f} s"
    if value < 3600:
        return f"{value / 60:.0f} min"
    if value < 86400 * 2:
        return f"{value / 3600:.1f} h"
    return f"{value / 86400:.0f} d"
