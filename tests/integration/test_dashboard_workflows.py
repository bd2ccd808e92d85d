"""The dashboard's workflow pages, against the real database: the list (paged, counters),
one workflow (its steps and edges, its callbacks, the SVG graph, paged steps), the job
page's link to its workflow, and cancelling a workflow through the confirmation page."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

import sa_jobs
from sa_jobs import JobState
from sa_jobs.dashboard import create_app, workflow_view
from tests.dashboard import DashboardClient, forms_posting
from tests.helpers import fetch_one, job_states
from tests.helpers import insert_workflow as insert


@sa_jobs.job_args(kind="dash_wf_step")
class Step:
    n: int = 0


@sa_jobs.job_args(kind="dash_wf_done")
class Done:
    n: int = 0


@pytest.fixture
def client(engine: Engine) -> Iterator[DashboardClient]:
    with DashboardClient(create_app(engine)) as client:
        yield client


def states_of(engine: Engine, ids: object) -> dict[int, JobState]:
    wanted = set(ids)  # type: ignore[call-overload]
    return {i: s for i, s in job_states(engine).items() if i in wanted}


def diamond(name: str = "diamond <b>") -> sa_jobs.Workflow:
    wf = sa_jobs.Workflow(name, on_complete=Done(1))
    a = wf.add(Step(1), name="a")
    b = wf.add(Step(2), name="b", after=[a])
    c = wf.add(Step(3), name="c", after=[a])
    wf.add(Step(4), name="d", after=[b, c])
    return wf


def test_the_list_shows_each_workflow_with_its_counters_newest_first_and_pages(
    client: DashboardClient, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workflow_view, "LIST_PAGE", 2)
    first = insert(engine, diamond("first"))
    second = insert(engine, diamond("second"))
    third = insert(engine, diamond("third <i>"))
    a = fetch_one(engine)
    assert a.id == first.jobs["a"]
    with Session(engine) as session, session.begin():
        sa_jobs.complete_in(session, a)

    page = client.get("/workflows").text
    linked = [int(n) for n in re.findall(r'<a href="/workflows/(\d+)">\1</a>', page)]
    assert linked == [third.id, second.id]
    assert "third &lt;i&gt;" in page and "third <i>" not in page  # escaped
    nxt = re.search(r'<a rel="next" href="([^"]+)"', page)
    assert nxt is not None
    older = client.get(nxt.group(1).replace("&amp;", "&")).text
    assert [int(n) for n in re.findall(r'<a href="/workflows/(\d+)">\1</a>', older)] == [first.id]
    assert 'rel="next"' not in older
    # first: 4 steps, 1 completed, 0 failed, 3 unfinished, not finished.
    row = older.split(f'<a href="/workflows/{first.id}">', 1)[1].split("</tr>", 1)[0]
    cells = re.findall(r'<td class="num">(?:<span[^>]*>)?([\d,]+)', row)
    assert cells == ["4", "1", "0", "3"]
    assert '<td class="wf-finished">no</td>' in row
    assert client.get("/workflows?before=abc").status_code == 400


def test_a_workflow_page_shows_steps_edges_callbacks_and_the_graph(
    client: DashboardClient, engine: Engine
) -> None:
    inserted = insert(engine, diamond())
    ids = inserted.jobs
    page = client.get(f"/workflows/{inserted.id}").text
    assert "diamond &lt;b&gt;" in page
    # Each step's row: what it waits for and what waits for it, linked.
    rows = dict(re.findall(r'<tr>\s*<td><a href="/jobs/\d+">(\w)</a></td>(.*?)</tr>', page, re.S))
    assert set(rows) == {"a", "b", "c", "d"}
    assert re.search(rf'wf-deps">-</td>.*href="/jobs/{ids["b"]}"', rows["a"], re.S)
    deps_of_d = rows["d"].split('class="wf-deps">', 1)[1].split("</td>", 1)[0]
    assert f'/jobs/{ids["b"]}"' in deps_of_d and f'/jobs/{ids["c"]}"' in deps_of_d
    assert "2 unresolved" in rows["d"]
    # The callback, with its state.
    callbacks = page.split('<table class="callbacks">', 1)[1].split("</table>", 1)[0]
    assert "on_complete" in callbacks and f'/jobs/{inserted.callbacks["on_complete"]}"' in callbacks
    # The graph: an SVG with one linked node per step, in layers by depth, and 4 edges.
    svg = page.split("<svg", 1)[1].split("</svg>", 1)[0]
    nodes = re.findall(
        r'<a href="/jobs/(\d+)" class="wf-node node-(\w+)">'
        r'\s*<title>[^<]*</title>\s*<rect x="(\d+)"',
        svg,
    )
    xs = {int(job): int(x) for job, _, x in nodes}
    assert xs[ids["a"]] < xs[ids["b"]] == xs[ids["c"]] < xs[ids["d"]]
    assert svg.count('class="wf-edge') == 4
    assert {state for _, state, _ in nodes} == {"available", "pending"}
    assert "<script" not in page


def test_a_big_workflow_is_paged_by_step_and_not_drawn(
    client: DashboardClient, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workflow_view, "STEPS_PAGE", 3)
    monkeypatch.setattr(workflow_view, "GRAPH_LIMIT", 4)
    monkeypatch.setattr(workflow_view, "COUNT_LIMIT", 4)
    monkeypatch.setattr(workflow_view, "EDGES_SHOWN", 2)
    wf = sa_jobs.Workflow("fan")
    root = wf.add(Step(0), name="root")
    for n in range(1, 7):
        wf.add(Step(n), name=f"s{n}", after=[root])
    inserted = insert(engine, wf)
    page = client.get(f"/workflows/{inserted.id}").text
    assert "<svg" not in page and "Not drawn" in page and "Not counted" in page
    names = re.findall(r'<tr>\s*<td><a href="/jobs/\d+">(\w+)</a></td>', page)
    assert names == ["root", "s1", "s2"]
    root_row = page.split(">root</a></td>", 1)[1].split("</tr>", 1)[0]
    assert " and more" in root_row  # 6 dependents, 2 listed
    seen = list(names)
    nxt = re.search(r'<a rel="next" href="([^"]+)"', page)
    while nxt:
        page = client.get(nxt.group(1).replace("&amp;", "&")).text
        seen += re.findall(r'<tr>\s*<td><a href="/jobs/\d+">(\w+)</a></td>', page)
        nxt = re.search(r'<a rel="next" href="([^"]+)"', page)
    assert seen == ["root", "s1", "s2", "s3", "s4", "s5", "s6"]


def test_the_job_page_links_a_step_to_its_workflow_and_its_neighbours(
    client: DashboardClient, engine: Engine
) -> None:
    inserted = insert(engine, diamond())
    ids = inserted.jobs
    page = client.get(f"/jobs/{ids['b']}").text
    place = page.split('class="fields workflow-place"', 1)[1].split("</table>", 1)[0]
    assert f'href="/workflows/{inserted.id}"' in place
    assert f'href="/jobs/{ids["a"]}">a</a>' in place and f'href="/jobs/{ids["d"]}">d</a>' in place
    callback = client.get(f"/jobs/{inserted.callbacks['on_complete']}").text
    assert f'href="/workflows/{inserted.id}"' in callback and "on_complete" in callback
    # A job outside any workflow shows no workflow section.
    with Session(engine) as session, session.begin():
        plain = sa_jobs.insert(session, Step(9)).job.id
    assert "workflow-place" not in client.get(f"/jobs/{plain}").text


def test_cancel_asks_first_then_cancels_through_cancel_workflow(
    client: DashboardClient, engine: Engine
) -> None:
    inserted = insert(engine, diamond())
    page = client.get(f"/workflows/{inserted.id}").text
    assert f"/workflows/{inserted.id}/cancel" in forms_posting(page)
    asked = client.act(f"/workflows/{inserted.id}/cancel")
    assert asked.status_code == 200 and "Cancel workflow" in asked.text
    assert set(states_of(engine, inserted.jobs.values()).values()) != {JobState.CANCELLED}
    done = client.act(f"/workflows/{inserted.id}/cancel", confirm="yes")
    assert done.status_code == 303
    shown = client.get(done.headers["location"]).text
    assert "Workflow cancelled: 5 jobs" in shown  # 4 steps and the callback
    states = states_of(engine, [*inserted.jobs.values(), inserted.callbacks["on_complete"]])
    assert set(states.values()) == {JobState.CANCELLED}
    assert f"/workflows/{inserted.id}/cancel" not in forms_posting(shown)  # finished now
    assert client.act("/workflows/999999/cancel").status_code == 404
    assert client.get("/workflows/999999").status_code == 404


def test_a_read_only_dashboard_shows_no_cancel_and_refuses_it(engine: Engine) -> None:
    inserted = insert(engine, diamond())
    with DashboardClient(create_app(engine, read_only=True)) as client:
        page = client.get(f"/workflows/{inserted.id}").text
        assert forms_posting(page) == []
        refused = client.act(f"/workflows/{inserted.id}/cancel", confirm="yes")
        assert refused.status_code == 403
    assert JobState.CANCELLED not in states_of(engine, inserted.jobs.values()).values()


def test_without_a_csrf_token_nothing_is_cancelled(client: DashboardClient, engine: Engine) -> None:
    inserted = insert(engine, diamond())
    refused = client.post(f"/workflows/{inserted.id}/cancel", data={"confirm": "yes"})
    assert refused.status_code == 403
    assert JobState.CANCELLED not in states_of(engine, inserted.jobs.values()).values()


def test_the_graph_layout_puts_each_step_right_of_its_deepest_dependency() -> None:
    steps = [(n, f"s{n}", "k", JobState.PENDING) for n in range(1, 6)]
    # 1 -> 2 -> 3, 1 -> 4, (3, 4) -> 5: 5 sits right of 3 (depth 3), not of 4.
    edges = [(1, 2, False), (2, 3, False), (1, 4, False), (3, 5, False), (4, 5, False)]
    graph = workflow_view.layout(steps, edges)
    x = {node.id: node.x for node in graph.nodes}
    assert x[1] < x[2] == x[4] < x[3] < x[5]
    assert len(graph.lines) == 5
    assert graph.width >= x[5] + graph.node_width


def test_without_the_workflow_branch_the_pages_say_so_and_jobs_still_show(
    core_only: Engine,
) -> None:
    with Session(core_only) as session, session.begin():
        job_id = sa_jobs.insert(session, Step(1)).job.id
    with DashboardClient(create_app(core_only)) as client:
        listing = client.get("/workflows")
        assert listing.status_code == 200
        assert "<code>sa_jobs_workflow</code> migration branch is not installed" in listing.text
        page = client.get(f"/jobs/{job_id}")
        assert page.status_code == 200 and "workflow-place" not in page.text
        one = client.get("/workflows/1")
        assert "sa_jobs_workflow&#39; migration branch is not installed" in one.text
