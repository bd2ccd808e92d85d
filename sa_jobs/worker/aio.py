"""The event loop that async handlers run on, in a thread of its own."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

__all__ = ["EventLoopThread"]


class EventLoopThread:
    def __init__(self, engine: Engine) -> None:
        self._sync_engine = engine
        self._async_engine: AsyncEngine | None = None
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="sa_jobs-asyncio", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coroutine: Coroutine[Any, Any, None]) -> concurrent.futures.Future[None]:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def async_engine(self) -> AsyncEngine:
        """An async engine on the same database, made on first use (on the loop thread)."""
        if self._async_engine is None:
            self._async_engine = create_async_engine(self._sync_engine.url)
        return self._async_engine

    def stop(self) -> None:
        if self._async_engine is not None:
            self.submit(self._async_engine.dispose()).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()
