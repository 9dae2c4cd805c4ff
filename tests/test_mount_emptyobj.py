"""The mount's shared empty object (:mod:`lakefuse.mount.emptyobj`) against a store that hangs
on its first upload: the stamp watch's round asks for a renewal every time, and must not wait
behind that upload (the watch would stop noticing changes made behind the mount)."""

from __future__ import annotations

import threading
import time

from lakefuse.mount.emptyobj import EmptyObject
from tests.mount_core_testutil import seeded_repo


def test_a_round_of_the_watch_does_not_wait_behind_a_hung_first_upload(tmp_path):
    with seeded_repo(tmp_path, "emptyobj", {"a": b"a"}) as repo:
        release = threading.Event()
        real_put = repo.put_object

        def hung_put(data):
            release.wait(30)  # a store that accepts and does not answer, until released
            return real_put(data)

        repo.put_object = hung_put
        empty = EmptyObject(repo)
        first = threading.Thread(target=empty.entry, daemon=True)  # the first create, in its request thread
        first.start()
        deadline = time.monotonic() + 5
        while not empty._lock.locked():
            assert time.monotonic() < deadline
            time.sleep(0.001)
        t0 = time.monotonic()
        ticked = threading.Thread(target=empty.tick, daemon=True)
        ticked.start()
        ticked.join(2)
        waited = time.monotonic() - t0
        alive = ticked.is_alive()
        release.set()
        first.join(10)
        assert not alive, f"the watch's round waited {waited:.1f} s behind the hung upload"
        # healthy: the upload went through and names a real empty object
        e = empty.entry()
        assert empty.ready and repo._store.get(e.address) == b""
