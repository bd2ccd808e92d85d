"""The partition key's text, and the declarations that name its fields."""

from __future__ import annotations

import pytest

import sa_jobs
from sa_jobs._declare.partitions import MAX_KEY_LENGTH, check_field_names, partition_key_of
from sa_jobs.errors import InvalidJobArgsError, InvalidOptionsError
from sa_jobs.worker.keyed_statement import next_cursor


@pytest.mark.parametrize(
    ("fields", "args", "key"),
    [
        (["tenant"], {"tenant": "acme"}, "acme"),
        (["tenant"], {"tenant": 42}, "42"),
        (["tenant"], {"tenant": {"id": 1}}, '{"id":1}'),
        (["region", "customer"], {"region": "eu", "customer": 7}, '["eu",7]'),
        (["region", "customer"], {"region": None, "customer": 7}, "[null,7]"),
        (["tenant"], {"tenant": None}, None),
        (["tenant"], {}, None),
        (["tenant"], ["not", "an", "object"], None),
        # A stored Ref keys by the row it names; other objects stay JSON.
        (["r"], {"r": {"table": "invoice", "pk": [7]}}, "invoice:7"),
        (["r"], {"r": {"table": "app.line", "pk": ["A", 2]}}, 'app.line:["A",2]'),
        (["r"], {"r": {"pk": [7], "table": "t"}}, "t:7"),
        (["r", "n"], {"r": {"table": "t", "pk": ["x"]}, "n": 1}, '["t:x",1]'),
        (["r"], {"r": {"table": "t", "pk": 7}}, '{"table":"t","pk":7}'),
        (["r"], {"r": {"table": "t", "pk": [7], "x": 1}}, '{"table":"t","pk":[7],"x":1}'),
    ],
)
def test_the_key_text(fields: list[str], args: object, key: str | None) -> None:
    assert partition_key_of("k", fields, args) == key


def test_a_key_too_long_for_an_index_entry_is_refused() -> None:
    with pytest.raises(InvalidJobArgsError, match="partition key"):
        partition_key_of("k", ["t"], {"t": "x" * (MAX_KEY_LENGTH + 1)})


@pytest.mark.parametrize(
    ("fields", "message"),
    [("tenant", r"\['tenant'\]"), ([], "at least one"), (["a", "a"], "twice"), ([""], "non-empty")],
)
def test_field_lists_are_checked(fields: object, message: str) -> None:
    with pytest.raises(InvalidOptionsError, match=message):
        check_field_names("by_args", fields)


def test_a_list_payload_has_no_fields_to_key_by() -> None:
    with pytest.raises(InvalidOptionsError, match="list payload"):

        @sa_jobs.job_args(kind="test_partition_list", list_payload=True, partition_by=["items"])
        class Listed:
            items: list[int]


@pytest.mark.parametrize(
    ("cursor", "keys", "after"),
    [
        (None, ["b", "a", None], "b"),
        ("b", ["c", "d"], "d"),
        ("c", ["d", "a", "b"], "b"),  # wrapped: the last key taken is at or below the cursor
        ("c", [], "c"),
        ("é", ["z", "éa"], "z"),  # code point order (z < é), as the collation "C"
    ],
)
def test_the_cursor_moves_past_the_last_key_taken(
    cursor: str | None, keys: list[str | None], after: str | None
) -> None:
    assert next_cursor(cursor, keys) == after
