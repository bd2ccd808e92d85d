"""What an insert statement returns is read in one place, by name, whoever runs it.

The ORM paths (``insert``, ``insert_many``) load each row's job as a ``Job``; the flush
hook and periodic jobs keep the row's columns. Both hand the row's mapping to
``decode_returned``, and ``write_rows`` reaches the job only through a ``JobForm``.
"""

from __future__ import annotations

from typing import Any

from sa_jobs._insert.insert import ORM_JOBS, ROW_COLUMNS, decode_returned
from sa_jobs._insert.insert_statement import MET_COLUMNS
from sa_jobs._table.models import EXISTED_COLUMN, Job

MET = {"met_args": {"n": 1}, "met_metadata": {"m": 2}, "met_errors": []}


def test_a_written_row_carries_no_met_values_even_when_the_statement_returns_them() -> None:
    row = {"id": 7, EXISTED_COLUMN: False, **dict.fromkeys(MET_COLUMNS)}
    returned = decode_returned(row, dict(row))
    assert (returned.existed, returned.met, returned.job_key, returned.revision) == (
        False,
        None,
        None,
        None,
    )


def test_a_met_row_carries_the_stored_columns_by_their_own_names() -> None:
    row = {"id": 7, EXISTED_COLUMN: True, **MET}
    returned = decode_returned(row, "the job")
    assert returned.existed
    assert returned.met == {"args": {"n": 1}, "metadata": {"m": 2}, "errors": []}
    assert returned.job == "the job"


def test_a_met_row_of_a_statement_without_met_columns_has_none() -> None:
    returned = decode_returned({"id": 7, EXISTED_COLUMN: True}, None)
    assert returned.existed and returned.met is None


def test_a_keyed_row_carries_its_key_and_revision() -> None:
    row = {"id": 7, EXISTED_COLUMN: True, "job_key": "k", "revision": 3}
    returned = decode_returned(row, None)
    assert (returned.job_key, returned.revision) == ("k", 3)


def test_each_form_completes_its_job_with_the_columns_the_statement_did_not_return() -> None:
    columns: dict[str, Any] = {"id": 7, "state": "available"}
    completed = ROW_COLUMNS.with_values(columns, {"args": {"n": 1}})
    assert completed == {"id": 7, "state": "available", "args": {"n": 1}}
    assert columns == {"id": 7, "state": "available"}  # the mapping read is left alone
    assert ROW_COLUMNS.id_of(completed) == 7

    job: Job[Any] = Job(kind="k", args_json={})
    job.id = 9
    assert ORM_JOBS.with_values(job, {"args": {"n": 1}, "metadata": {"m": 2}}) is job
    assert (job.args_json, job.metadata_) == ({"n": 1}, {"m": 2})
    assert ORM_JOBS.id_of(job) == 9
