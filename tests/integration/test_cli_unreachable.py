"""A URL whose servers all fail: one line naming each server's failure, after at most
the connect timeout — never a hang (issue 27, "Bad input")."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from sa_jobs.cli import common, main
from tests.failover.cluster import free_port


@contextlib.contextmanager
def silent_servers(count: int) -> Iterator[list[int]]:
    """Ports that accept TCP connections (the kernel completes the handshake) and never
    say a word: a server that hangs, or a proxy in front of a vanished machine."""
    sockets = []
    try:
        for _ in range(count):
            listener = socket.socket()
            listener.bind(("127.0.0.1", 0))
            listener.listen(8)
            sockets.append(listener)
        yield [listener.getsockname()[1] for listener in sockets]
    finally:
        for listener in sockets:
            listener.close()


def multi_host(ports: list[int], extra: str = "") -> str:
    hosts = "&".join(f"host=127.0.0.1:{port}" for port in ports)
    return f"postgresql+psycopg://postgres@/nowhere?{hosts}&target_session_attrs=read-write{extra}"


def run_bounded(argv: list[str], bound: float) -> tuple[int | None, float]:
    """``main(argv)`` in a thread; its exit code (None if it still runs after
    ``bound``) and how long it took."""
    result: list[int] = []
    started = time.monotonic()
    thread = threading.Thread(target=lambda: result.append(main(argv)), daemon=True)
    thread.start()
    thread.join(bound)
    return (result[0] if result else None), time.monotonic() - started


def test_closed_ports_fail_at_once_naming_every_server(capsys: pytest.CaptureFixture[str]) -> None:
    ports = [free_port(), free_port()]  # bound and released: nothing listens there

    code, took = run_bounded(["stats", "--url", multi_host(ports)], bound=20)

    assert code == 1
    assert took < 5
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "none of the URL's 2 servers accepted a connection" in err, err
    for port in ports:
        assert f"127.0.0.1:{port}: Connection refused" in err, err


def test_silent_servers_fail_after_the_connect_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    with silent_servers(2) as ports:
        # libpq's floor is 2 s a server: 2 servers, about 4 s.
        code, took = run_bounded(
            ["jobs", "list", "--url", multi_host(ports, "&connect_timeout=2")], bound=15
        )

    assert code == 1, "still connecting"
    assert 3.5 < took < 10
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    for port in ports:
        assert f"127.0.0.1:{port}: connection timeout expired" in err, err


def test_a_url_without_connect_timeout_gets_the_commands_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # libpq alone would wait for ever on a server that never answers.
    monkeypatch.setattr(common, "DEFAULT_CONNECT_TIMEOUT", 2)
    with silent_servers(2) as ports:
        code, took = run_bounded(["stats", "--url", multi_host(ports)], bound=15)

    assert code == 1, "hangs without a connect_timeout"
    assert took < 10
    assert "connection timeout expired" in capsys.readouterr().err


def test_a_url_keeps_its_own_connect_timeout() -> None:
    url = common.with_connect_timeout(common.parse_url(multi_host([1, 2], "&connect_timeout=7")))
    assert url.query["connect_timeout"] == "7"
    assert common.with_connect_timeout(common.parse_url(multi_host([1, 2]))).query[
        "connect_timeout"
    ] == str(common.DEFAULT_CONNECT_TIMEOUT)
