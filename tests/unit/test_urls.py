"""Switching a URL's driver translates what only one driver understands."""

from __future__ import annotations

from sqlalchemy import make_url

from sa_jobs.devdb import normalize_url
from sa_jobs.urls import in_driver


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
