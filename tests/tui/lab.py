"""A small, complete admin-socket server for tests: the real ``serve_admin`` and event bus
in front of ``LabDaemon``, an in-memory DaemonControl whose flush really empties its caches.

``LabServer`` runs it in its own trio run on a background thread, so asyncio code (the
dashboard, its client) can talk to it in the same process.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Any

import trio

from ibacm.core.admin import serve_admin
from ibacm.core.events import EventBus

EP1 = "mlx5_0/1/0xffff"
EP2 = "mlx5_0/2/0xffff"


class LabDaemon:
    """Endpoints with caches and groups, counters, log level and reload (DaemonControl)."""

    def __init__(self, bus: EventBus) -> None:
        self.bus = bus
        self.log_level = 0
        self.reloads = 0
        self.fail_reload = False
        self.capturing: str | None = None  # the path of the running MAD capture
        self.counters = [0, 12, 1, 0, 0, 3, 9]
        self.caches: dict[str, dict[str, dict[str, Any]]] = {
            EP1: {
                "10.0.0.3": {
                    "dest": "10.0.0.3",
                    "type": "ip",
                    "state": "READY",
                    "hits": 4,
                    "age": 5,
                    "dlid": 3,
                },
                "node4": {"dest": "node4", "type": "name", "state": "READY", "hits": 1, "dlid": 4},
            },
            EP2: {
                "10.0.1.3": {"dest": "10.0.1.3", "type": "ip", "state": "QUERY_ROUTE", "hits": 0},
            },
        }
        self.groups = {
            EP1: [
                {
                    "mgid": "ff15:4001:ffff:3:400::",
                    "mlid": 0xC001,
                    "rate": 3,
                    "mtu": 4,
                    "state": "joined",
                }
            ],
            EP2: [],
        }

    def snapshot(self) -> dict[str, Any]:
        return {
            "daemon": {
                "version": "lab",
                "pid": os.getpid(),
                "node": "lab",
                "log_level": self.log_level,
            },
            "counters": list(self.counters),
            "ports": [{"id": "mlx5_0/1", "state": "ACTIVE", "lid": 1, "sm_lid": 1}],
            "endpoints": [
                {
                    "id": ep,
                    "pkey": 0xFFFF,
                    "state": "ready",
                    "provider": "ibacmp",
                    "addresses": [{"type": "ip", "address": f"10.0.{n}.1/24"}],
                    "groups": self.groups[ep],
                    "cache": list(cache.values()),
                    "counters": list(self.counters),
                }
                for n, (ep, cache) in enumerate(self.caches.items())
            ],
        }

    async def flush(self, endpoint: str | None, dest: str | None) -> int:
        if endpoint is not None and endpoint not in self.caches:
            raise LookupError(f"unknown endpoint {endpoint!r}")
        flushed = 0
        for ep, cache in self.caches.items():
            if endpoint not in (None, ep):
                continue
            for key in [k for k in cache if dest in (None, k)]:
                del cache[key]
                flushed += 1
                self.bus.publish("cache", {"endpoint": ep, "dest": key, "removed": True})
        return flushed

    async def reload(self) -> list[str]:
        if self.fail_reload:
            raise OSError("ibacm_opts.cfg: permission denied")
        self.reloads += 1
        self.bus.publish("log", {"event": "configuration reloaded", "level": "info"})
        return []  # no changed option needs a restart

    def set_log_level(self, level: int) -> None:
        self.log_level = level

    async def capture(self, action: str, path: str | None) -> dict[str, Any]:
        # No fabric here: a capture writes no MAD, but starts, stops and reports as one.
        if action in ("start", "stop"):
            self.capturing = path if action == "start" else None
        return {"active": self.capturing is not None, "path": self.capturing, "records": 0}


class LabServer:
    """``serve_admin`` + LabDaemon in a trio run on a thread; start/stop like a daemon."""

    def __init__(self, path: Path, **serve_options: Any) -> None:
        self.path = path
        self.serve_options = serve_options
        self.bus = EventBus()
        self.daemon = LabDaemon(self.bus)
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> LabServer:
        self._started.clear()
        self._thread = threading.Thread(target=self._run, name="lab-admin", daemon=True)
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("lab admin server did not start")
        if self._error is not None:
            raise RuntimeError("lab admin server failed") from self._error
        return self

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # reported to start() or stop()
            self._error = exc
            self._started.set()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        with trio.CancelScope() as scope:
            self._scope = scope
            async with trio.open_nursery() as nursery:
                await nursery.start(
                    lambda task_status: serve_admin(
                        str(self.path),
                        self.daemon,
                        self.bus,
                        task_status=task_status,
                        **self.serve_options,
                    )
                )
                self._started.set()

    def run_sync(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` in the server's trio thread (e.g. ``bus.publish``)."""
        assert self._token is not None
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def publish(self, kind: str, data: dict[str, Any]) -> None:
        self.run_sync(self.bus.publish, kind, data)

    def stop(self) -> None:
        if self._thread is None or self._token is None or self._scope is None:
            return
        scope = self._scope
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(scope.cancel)
        self._thread.join(10)
        self._thread = None
        # The bus outlives a "restart", as state would in a restarted daemon's files.
        self.bus = EventBus()
        self.daemon.bus = self.bus
