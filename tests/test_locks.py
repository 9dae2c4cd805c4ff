"""graveler.locks.RWLock: shared holders together, an exclusive one alone and not starved."""

from __future__ import annotations

import threading
import time

from graveler.locks import RWLock


def test_shared_together_exclusive_alone_and_first_in_line():
    lock = RWLock()
    events: list[str] = []
    first_in = threading.Event()
    release_first = threading.Event()

    def reader(name: str, hold: threading.Event | None = None):
        with lock.shared():
            events.append(f"{name} in")
            if hold is not None:
                first_in.set()
                hold.wait(5)
            events.append(f"{name} out")

    def writer():
        with lock.exclusive():
            events.append("w in")
            events.append("w out")

    r1 = threading.Thread(target=reader, args=("r1", release_first))
    r1.start()
    assert first_in.wait(5)
    w = threading.Thread(target=writer)
    w.start()
    time.sleep(0.1)  # the writer waits for r1; a reader arriving now waits behind the writer
    r2 = threading.Thread(target=reader, args=("r2",))
    r2.start()
    time.sleep(0.1)
    assert events == ["r1 in"]
    release_first.set()
    for t in (r1, w, r2):
        t.join(5)
    assert events == ["r1 in", "r1 out", "w in", "w out", "r2 in", "r2 out"]


def test_many_shared_holders_at_once():
    lock = RWLock()
    inside = threading.Barrier(4, timeout=5)

    def reader():
        with lock.shared():
            inside.wait()  # all four inside together, or the barrier times out

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not inside.broken
