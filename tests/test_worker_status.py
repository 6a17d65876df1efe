"""The status board publishes a worker's status at most once per interval, however many
batches changed it, and still stops at once."""

from __future__ import annotations

import threading

from toolauthz.server.worker_status import StatusBoard
from toolauthz.service.status import PolicyStatus, PumpStatus, WorkerStatus


def test_changes_during_the_interval_wait_for_it_and_close_does_not(tmp_path):
    answered = [0]
    published = threading.Semaphore(0)

    def snapshot():
        return WorkerStatus(0, 1, PolicyStatus("v1", 0.0, "", 0, "", {}), PumpStatus(answered[0], answered[0], 0))

    board = StatusBoard(tmp_path, snapshot, min_interval=3600)
    real_publish = board.publish

    def counted():
        status = real_publish()
        published.release()
        return status

    board.publish = counted  # type: ignore[method-assign]
    board.start()
    assert published.acquire(timeout=30)  # start() publishes at once
    answered[0] = 1
    board.changed()
    assert published.acquire(timeout=30)  # the first change: published by the board's thread
    for n in range(2, 50):  # within the interval: none of these is written yet
        answered[0] = n
        board.changed()
    stopper = threading.Thread(target=board.close)
    stopper.start()
    stopper.join(30)
    assert not stopper.is_alive()  # the interval's wait ends with close()
    assert not published.acquire(timeout=0)
    assert '"answered": 1' in (tmp_path / "worker-0.json").read_text()
