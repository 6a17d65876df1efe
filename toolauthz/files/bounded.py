"""Reading a small file that someone else may have planted: at most a known size, never
blocking on a FIFO, and checked on the file actually opened (fstat), so that a swap
after the check cannot matter."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable


class FileRefused(Exception):
    """The file is not a regular file, or is larger than the limit (`reason` says which)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason  # "not_regular" | "too_large"


def read_bounded(path: str, max_bytes: int, check: Callable[[os.stat_result], None] | None = None) -> bytes:
    """The bytes of `path`, refused (FileRefused) before a byte is read when its size says
    it is over `max_bytes`, and while reading when it grows past it. `check` sees the
    opened file's stat first (a mode check). OSError when it cannot be opened."""
    # O_NONBLOCK: a FIFO planted at the path must not hang the reader.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused("not_regular")
        if check is not None:
            check(st)
        if st.st_size > max_bytes:
            raise FileRefused("too_large")
        data = b""
        while len(data) <= max_bytes and (chunk := os.read(fd, max_bytes + 1 - len(data))):
            data += chunk
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # it grew after the fstat
        raise FileRefused("too_large")
    return data
