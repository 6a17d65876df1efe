"""A grpc.aio server on an event loop of its own thread, with the blocking surface of
grpc.Server that the CLI, the workers and the tests use (`stop(grace).wait()`,
`wait_for_termination`).

Why aio: its event loop moves every message on one thread, and the coroutine handlers
hand decisions to the decision pump, so no thread per call wakes and takes the
interpreter lock in turn (toolauthz/server/pump.py), and an approval watch waits on the
loop, not on a thread (toolauthz/service/watching.py). Plain handlers (the approval calls
but the watch, GetKeys, GetStatus) run on a thread pool.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from concurrent import futures
from typing import TypeVar

import grpc

from toolauthz.service.call_limit import CallLimit

T = TypeVar("T")


class _LoopThread:
    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        # For the short blocking work coroutines hand off (an approval watch's store
        # reads, an audit query's page); nothing waits on these threads.
        self._executor = futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix=f"{name}-blocking")
        self.loop.set_default_executor(self._executor)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, make: Callable[[], Awaitable[T]], timeout: float | None = None) -> T:
        """Runs the coroutine `make()` on the loop and waits for its result."""
        async def call() -> T:
            return await make()
        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(timeout)

    def close(self) -> None:
        async def drain() -> None:
            current = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.loop.shutdown_asyncgens()
            await self.loop.shutdown_default_executor()

        self.run(drain)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class AioServer:
    """`build(server)` registers the services on a new grpc.aio server, created on the
    loop's thread (an aio server belongs to the loop it was made on)."""

    def __init__(self, build: Callable[[grpc.aio.Server], None], *, options: list, max_concurrent_rpcs: int,
                 max_streaming_rpcs: int, thread_pool_size: int, name: str = "grpc-loop",
                 before_stop: Callable[[], Awaitable[None]] | None = None):
        self._loop = _LoopThread(name)
        self._before_stop = before_stop
        self._pool = futures.ThreadPoolExecutor(max_workers=thread_pool_size, thread_name_prefix="grpc-handler")
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()
        self._after_stop: list[Callable[[], None]] = []
        # Servers sharing this loop (the HTTP API), each stopped with the gRPC server.
        self._companions: list[Callable[[float | None], Awaitable[None]]] = []
        self.http_port: int | None = None
        self.console_port: int | None = None  # the browser console's (toolauthz/console/), when served

        async def create() -> grpc.aio.Server:
            # The cap is ours, not grpc.aio's: see toolauthz/service/call_limit.py.
            server = grpc.aio.server(migration_thread_pool=self._pool, options=options,
                                     interceptors=[CallLimit(max_concurrent_rpcs, max_streaming_rpcs)])
            build(server)
            return server

        try:
            self._server: grpc.aio.Server = self._loop.run(create)
        except BaseException:
            self._close_loop()
            raise

    def add_insecure_port(self, address: str) -> int:
        """The bound port; OSError when the address cannot be bound (grpc.aio raises a
        RuntimeError where the thread-pool server returned 0)."""
        return self._add_port(address, lambda: self._server.add_insecure_port(address))

    def add_secure_port(self, address: str, credentials: grpc.ServerCredentials) -> int:
        """As `add_insecure_port`, with TLS."""
        return self._add_port(address, lambda: self._server.add_secure_port(address, credentials))

    def _add_port(self, address: str, add: Callable[[], int]) -> int:
        async def on_the_loop() -> int:
            return add()
        try:
            port = self._loop.run(on_the_loop)
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {address}") from exc
        if port == 0:
            raise OSError(f"cannot listen on {address}")
        return port

    def after_stop(self, cleanup: Callable[[], None]) -> None:
        """`cleanup()` runs once the server has stopped (e.g. to remove its socket file)."""
        self._after_stop.append(cleanup)

    def run(self, make: Callable[[], Awaitable[T]]) -> T:
        """Runs the coroutine `make()` on the server's loop and waits for its result."""
        return self._loop.run(make)

    def start(self) -> None:
        self._loop.run(self._server.start)

    def add_companion(self, stop: Callable[[float | None], Awaitable[None]]) -> None:
        """Registers a server running on this loop: `stop(grace)` is awaited with the gRPC
        server's own stop, before the loop closes."""
        self._companions.append(stop)

    def stop(self, grace: float | None) -> threading.Event:
        """Stops taking calls (new ones are refused at once), lets those in flight finish
        for up to `grace` seconds (None: cancel them now), then closes the loop; returns
        an event set once all is done."""
        with self._stop_lock:
            if not self._stopped.is_set():
                try:
                    if self._before_stop is not None:
                        self._loop.run(self._before_stop)
                    self._loop.run(lambda: self._stop_all(grace))
                finally:
                    self._close_loop()
                    for cleanup in self._after_stop:
                        cleanup()
                    self._stopped.set()
        return self._stopped

    async def _stop_all(self, grace: float | None) -> None:
        await asyncio.gather(self._server.stop(grace), *(stop(grace) for stop in self._companions))

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        """True once stopped; False if `timeout` passed first."""
        return self._stopped.wait(timeout)

    def _close_loop(self) -> None:
        self._loop.close()
        self._pool.shutdown(wait=True, cancel_futures=True)
