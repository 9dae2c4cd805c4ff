"""lakefuse.mount.backing without a kernel: the rules the kernel enforces for an inode's opens
(one backing file while passthrough opens last, no cached open meanwhile, no passthrough open
while cached ones last), as the core's admission of each open."""

from __future__ import annotations

from lakefuse.mount.backing import CACHED, PASSTHROUGH, STALE, Backings


def test_an_inode_takes_one_backing_file_and_no_cached_open_while_it_lasts():
    b = Backings()
    assert b.bind(7, b"A") == PASSTHROUGH
    b.opened(1, 7, True)
    assert b.bind(7, b"A") == PASSTHROUGH  # a second reader shares the file
    b.opened(2, 7, True)
    assert b.bind(7, b"B") == STALE  # a newer version: the name needs a new inode
    assert not b.hold(7)  # a writer too
    b.released(1)
    assert not b.hold(7) and b.bound(7)
    b.released(2)
    assert not b.bound(7) and b.counts() == (0, 0)
    assert b.hold(7)  # none left: a cached open is admitted
    b.opened(3, 7, False)
    assert b.bind(7, b"B") == CACHED  # and a reader now is served by the daemon (held as well)
    b.opened(4, 7, False)
    b.released(3)
    assert b.bind(7, b"B") == CACHED
    b.undo(7, False)  # that open failed
    b.released(4)
    assert b.counts() == (0, 0)
    assert b.bind(7, b"B") == PASSTHROUGH


def test_a_refused_passthrough_open_becomes_a_cached_one():
    b = Backings()
    assert b.bind(9, b"A") == PASSTHROUGH
    b.opened(1, 9, True)
    b.refused(1)  # the kernel said no: the daemon serves it
    assert not b.bound(9) and b.counts() == (0, 1)
    assert b.bind(9, b"A") == CACHED
    b.opened(2, 9, False)
    b.released(1)
    b.released(2)
    assert b.counts() == (0, 0)


def test_a_refused_writers_retry_finds_the_names_next_inode_unbound(monkeypatch):
    """A stress test's finding: a writer refused on an inode passthrough readers held got
    ESTALE, and when a reader bound the name's next inode before the kernel's one retry came,
    the retry was refused too and ESTALE reached the writer (100-350 times in 8 s, and the
    writes it made the program give up). Readers of that name are served by the daemon until
    the retry comes (at most WRITER_WAIT_S), so the writer's retry is admitted."""
    import lakefuse.mount.backing as backing

    b = Backings()
    assert b.bind(7, b"A", key="f") == PASSTHROUGH  # a reader of the file
    b.opened(1, 7, True)
    assert not b.hold(7)  # a writer: refused, the name gets a new inode
    b.writer_waits("f")
    assert b.bind(8, b"A", key="f") == CACHED  # a reader on the new inode, before the retry
    b.opened(2, 8, False)
    assert b.hold(8)  # the writer's retry is admitted
    assert b.bind(9, b"A", key="g") == PASSTHROUGH  # another name is not held back
    now = backing.time.monotonic()
    monkeypatch.setattr(backing.time, "monotonic", lambda: now + backing.WRITER_WAIT_S + 1)
    assert b.bind(10, b"A", key="f") == PASSTHROUGH  # the wait is over
