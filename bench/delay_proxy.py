"""A TCP proxy on loopback that delays every chunk by a fixed time in each direction:
a database on another host, as far as round trips go (not bandwidth). Chunks are
forwarded in order, each `delay` seconds after it arrived, so several in flight overlap
as on a real link. Runs on an asyncio loop in a thread of its own.

`waves` counts round trips as a client waits for them: a chunk from a client counts
when it is the connection's first or the client had been answered since its last one
(so statements sent together in a pipeline are one wave, a statement sent after reading
the answer to another a second). With a delay well above the client's own pauses
between writes, it is exact and independent of the machine's speed."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time


class DelayProxy:
    """Listens on 127.0.0.1:`port` (0: any free port) and forwards to `target`."""

    def __init__(self, target: tuple[str, int], delay: float, port: int = 0):
        self.target, self.delay = target, delay
        self.chunks_up = 0  # chunks the clients sent (each a flush of theirs: about a round trip)
        self.waves = 0  # round trips the clients waited for (the module's docstring)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()  # every connection's two ends, closed at close()
        self._thread = threading.Thread(target=self._run, args=(port,), name="delay-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the delay proxy did not start")
        assert self._server is not None
        self.port = self._server.sockets[0].getsockname()[1]

    def _run(self, port: int) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._server = await asyncio.start_server(self._client, "127.0.0.1", port)
            self._ready.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.add(up_writer)
        answered = [True]  # the client was answered since its last chunk (a new connection: yes)
        with contextlib.suppress(asyncio.CancelledError):  # close(): ends quietly
            await asyncio.gather(self._pump(reader, up_writer, answered, up=True),
                                 self._pump(up_reader, writer, answered))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answered: list[bool],
                    up: bool = False) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, chunk = await queue.get()
                if not chunk:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(chunk)
                if not up:
                    answered[0] = True
                await writer.drain()

        sender = asyncio.ensure_future(deliver())
        try:
            while chunk := await reader.read(65536):
                queue.put_nowait((time.monotonic() + self.delay, chunk))
                if up:
                    self.chunks_up += 1
                    if answered[0]:
                        self.waves += 1
                        answered[0] = False
        except OSError:
            pass
        queue.put_nowait((0.0, b""))
        with contextlib.suppress(OSError, ConnectionError):
            await sender
            writer.close()

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
            for writer in self._writers:
                writer.close()
                with contextlib.suppress(OSError, ConnectionError, asyncio.CancelledError):
                    await writer.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()
