"""lakefuse.mount.md5stream: the MD5 of a stream whose large pieces are hashed in another thread."""

from __future__ import annotations

import hashlib
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from lakefuse.mount import md5stream
from lakefuse.mount.md5stream import BESIDE_MIN, MAX_PENDING, Md5Stream


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0, 1, 100, BESIDE_MIN - 1, BESIDE_MIN, BESIDE_MIN + 7, 3 * BESIDE_MIN]),
                max_size=24), st.integers(0, 255))
def test_the_digest_is_hashlibs_whatever_the_pieces(sizes, seed):
    """Small and large pieces in any order: the digest is hashlib's over their concatenation
    (the small ones after a large one queue behind it)."""
    pieces = [bytes([(seed + i + j) % 256 for j in range(min(n, 97))]) * (n // 97) + bytes(n % 97)
              for i, n in enumerate(sizes)]
    s = Md5Stream()
    for p in pieces:
        s.update(p)
    assert s.hexdigest() == hashlib.md5(b"".join(pieces)).hexdigest()


def test_large_pieces_are_hashed_in_the_hashing_thread_small_ones_at_once(monkeypatch):
    where = []
    real = hashlib.md5

    class Spy:
        def __init__(self, *a, **k):
            self._h = real(*a, **k)

        def update(self, data):
            where.append((len(data), threading.current_thread().name))
            self._h.update(data)

        def hexdigest(self):
            return self._h.hexdigest()

    monkeypatch.setattr(md5stream.hashlib, "md5", Spy)
    s = Md5Stream()
    s.update(b"x" * 10)
    s.update(b"y" * BESIDE_MIN)
    s.update(b"z" * 10)  # behind the large one: queued too
    s.hexdigest()
    me = threading.current_thread().name
    assert where[0] == (10, me)
    assert where[1][0] == BESIDE_MIN and where[1][1].startswith("lakefuse-md5")
    assert where[2][0] == 10 and where[2][1].startswith("lakefuse-md5")
    where.clear()
    s2 = Md5Stream()
    s2.update(b"a" * 10)  # nothing waiting: at once
    assert where == [(10, me)]


def _held_up_md5(gate: threading.Event):
    """An ``hashlib.md5`` whose updates wait for ``gate``: a hashing thread slower than the writer."""
    real = hashlib.md5

    class HeldUp:
        def __init__(self, *a, **k):
            self._h = real(*a, **k)

        def update(self, data):
            gate.wait(10)
            self._h.update(data)

        def hexdigest(self):
            return self._h.hexdigest()

    return HeldUp


def test_at_most_max_pending_pieces_wait(monkeypatch):
    """A writer faster than the hashing thread waits for it: no more than MAX_PENDING pieces
    (and their bytes) are held."""
    gate = threading.Event()
    seen = []
    real = hashlib.md5

    monkeypatch.setattr(md5stream.hashlib, "md5", _held_up_md5(gate))
    s = Md5Stream()
    piece = b"p" * BESIDE_MIN
    done = threading.Event()

    def writer():
        for _ in range(MAX_PENDING + 3):
            s.update(piece)
            seen.append(len(s._pending))
        done.set()

    t = threading.Thread(target=writer)
    t.start()
    assert not done.wait(0.5)  # blocked: the hashing thread holds up
    assert max(seen) <= MAX_PENDING
    gate.set()
    t.join(10)
    assert done.is_set() and max(seen) <= MAX_PENDING
    assert s.hexdigest() == real(piece * (MAX_PENDING + 3)).hexdigest()


def test_the_process_holds_at_most_max_held_pieces_of_all_streams(monkeypatch):
    gate = threading.Event()
    real = hashlib.md5

    monkeypatch.setattr(md5stream.hashlib, "md5", _held_up_md5(gate))
    monkeypatch.setattr(md5stream, "_held", threading.BoundedSemaphore(3))
    streams = [Md5Stream(), Md5Stream()]
    piece = b"q" * BESIDE_MIN
    fed = []

    def writer():
        for i in range(5):
            streams[i % 2].update(piece)
            fed.append(i)

    t = threading.Thread(target=writer)
    t.start()
    t.join(0.5)
    assert len(fed) == 3  # the fourth piece waits for a slot (each stream holds fewer than MAX_PENDING)
    gate.set()
    t.join(10)
    assert len(fed) == 5
    assert streams[0].hexdigest() == real(piece * 3).hexdigest()
    assert streams[1].hexdigest() == real(piece * 2).hexdigest()
