"""Switching a URL's driver translates what only one driver understands."""

from __future__ import annotations

import pytest
from sqlalchemy import make_url

from sa_jobs._base.urls import in_driver, servers
from sa_jobs.devdb import normalize_url


def test_an_asyncpg_url_becomes_a_libpq_one_keeping_what_libpq_knows() -> None:
    url = make_url(
        "postgresql+asyncpg://app:secret@db.example.com:6432/app"
        "?ssl=require&prepared_statement_cache_size=0&command_timeout=5&application_name=web"
    )
    sync = in_driver(url, "psycopg")
    assert sync.drivername == "postgresql+psycopg"
    assert (sync.username, sync.password, sync.host, sync.port, sync.database) == (
        "app",
        "secret",
        "db.example.com",
        6432,
        "app",
    )
    assert dict(sync.query) == {"sslmode": "require", "application_name": "web"}


def test_asyncpg_ssl_booleans_map_to_sslmodes_and_an_explicit_sslmode_wins() -> None:
    assert dict(in_driver(make_url("postgresql+asyncpg://h/d?ssl=true"), "psycopg").query) == {
        "sslmode": "require"
    }
    both = make_url("postgresql+asyncpg://h/d?ssl=require&sslmode=verify-full")
    assert dict(in_driver(both, "psycopg").query) == {"sslmode": "verify-full"}


def test_between_libpq_drivers_the_query_is_kept_as_it_is() -> None:
    url = make_url("postgresql+psycopg2://h/d?sslmode=require&connect_timeout=3")
    assert dict(in_driver(url, "psycopg_async").query) == dict(url.query)
    assert in_driver(url, "psycopg_async").drivername == "postgresql+psycopg_async"


def test_the_command_line_and_test_tools_accept_an_async_apps_url() -> None:
    for raw in (
        "postgres://h/d",
        "postgresql://h/d",
        "postgresql+psycopg2://h/d",
        "postgresql+asyncpg://h/d?ssl=disable",
        "postgresql+psycopg_async://h/d",
    ):
        assert normalize_url(raw).drivername == "postgresql+psycopg", raw
    assert dict(normalize_url("postgresql+asyncpg://h/d?ssl=disable").query) == {
        "sslmode": "disable"
    }


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("postgresql+psycopg://u@db:5433/jobs", "db:5433"),
        ("postgresql+psycopg://u@/jobs", "localhost:5432"),
        ("postgresql+psycopg://u@/jobs?host=a:5432&host=b:5433", "a:5432,b:5433"),
        ("postgresql+psycopg://u@/jobs?host=a,b&port=5432,5433", "a:5432,b:5433"),
        ("postgresql+psycopg://u@/jobs?host=a&host=b&port=6000", "a:6000,b:6000"),
        ("postgresql+psycopg://u@/jobs?host=/run/postgresql", "/run/postgresql:5432"),
    ],
)
def test_messages_name_every_server_of_a_multi_host_url(url: str, said: str) -> None:
    assert servers(make_url(url)) == said
