"""Helpers shared by the graveler refs / staging / operations tests."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from graveler import Graveler, GravelerConfig, KVConfig, Repository
from graveler.model import Entry

FAST_KV = KVConfig(map_size=1 << 26, sync=False)

# The KV backend graveler's unit and model tests run on: tests/conftest.py runs each test of
# KV_MODULES once per backend and sets this before it ("lmdb", "memory" or "postgres").
KV_BACKENDS = ("lmdb", "memory", "postgres")
current_backend = "lmdb"
pg_url: str | None = None  # the session's test database (tests/conftest.py, fixture postgres_url)


def backend_kv(tmp_path: Path, base: KVConfig = FAST_KV) -> KVConfig:
    """``base`` on the backend under test: an in-memory space, or a PostgreSQL schema, of its own per test
    directory (so tests never see each other's repositories)."""
    if current_backend == "memory":
        return dataclasses.replace(base, url=f"memory://{tmp_path}")
    if current_backend == "postgres":
        from tests.pg_testutil import schema_url

        assert pg_url is not None, "the postgres backend needs the postgres_url fixture"
        return dataclasses.replace(base, url=schema_url(pg_url, str(tmp_path)))
    return base


def make_graveler(tmp_path: Path, **kw) -> Graveler:
    cfg = GravelerConfig(home=tmp_path / "home", kv=backend_kv(tmp_path, kw.pop("kv", FAST_KV)), **kw)
    return Graveler(cfg)


def make_repo(tmp_path: Path, name: str = "repo1", **kw) -> Repository:
    g = make_graveler(tmp_path, **kw)
    return g.create_repository(name, f"file://{tmp_path}/ns-{name}")


def entry(tag: str, size: int | None = None) -> Entry:
    """A synthetic entry whose identity depends on ``tag`` (no object behind it)."""
    return Entry(address=f"data/x/{tag}", size=len(tag) if size is None else size, etag=tag, last_modified_ns=1)


def contents(repo: Repository, ref: str) -> dict[bytes, str]:
    """path -> etag of everything on ``ref`` (recursive listing)."""
    return {it.path: it.entry.etag for it in repo.list(ref, delimiter="")}


def catalog_entries(text_max: int, metadata):
    """A Hypothesis strategy of catalog entries: any size an object can have, times around and far from the epoch, any
    address type; ``text_max`` bounds the strings, ``metadata`` is the strategy of user metadata."""
    from hypothesis import strategies as st

    from graveler.model import AddressType

    text = st.text(max_size=text_max)
    return st.builds(
        Entry,
        address=text,
        size=st.integers(0, 2**63 - 1),  # (a negative size is damage: Entry.from_proto_bytes refuses it)
        etag=text,
        last_modified_ns=st.one_of(st.just(0), st.integers(-(2**62), 2**62), st.integers(1, 10**9)),
        metadata=metadata(text),
        address_type=st.sampled_from(list(AddressType)),
        content_type=text,
    )


def damage_second_range(repo: Repository, ns: Path):
    """Zero 30 bytes near the start of the second range file of ``repo``'s ``main`` head (its
    storage namespace is directory ``ns``): the ranges (at least three) and the damaged one."""
    return damage_range(repo, ns, 1)


def damage_range(repo: Repository, ns: Path, index: int):
    """:func:`damage_second_range` of the range at ``index`` instead."""
    infos = repo._committed.list_ranges(repo.get_commit("main").meta_range_id)
    assert len(infos) >= 3
    victim = infos[index]
    path = ns / "_lakefs" / victim.id
    data = bytearray(path.read_bytes())
    data[10:40] = b"\x00" * 30
    path.write_bytes(bytes(data))
    return infos, victim


def killed_mid_write(code: str, args: list[str], parent: Path | str, fifo: Path | str) -> Path:
    """The temp file a writer leaves when killed between writing it and renaming it into place:
    ``python -c CODE ARGS...`` -- a writer copying the FIFO ``fifo`` to a file in ``parent`` --
    is fed one copy chunk and a little more (a buffered reader takes whole chunks: one lands,
    the next waits), then killed with SIGKILL once its new temp file has bytes."""
    from graveler.objstore import sparse

    parent = Path(parent)
    os.mkfifo(fifo)
    before = set(parent.glob(".lakefuse-tmp-*")) if parent.is_dir() else set()
    child = subprocess.Popen([sys.executable, "-c", code, *args], cwd=Path(__file__).resolve().parents[1])
    new: set[Path] = set()

    def written() -> bool:
        new.clear()
        new.update(set(parent.glob(".lakefuse-tmp-*")) - before if parent.is_dir() else set())
        return any(p.stat().st_size for p in new)

    with open(fifo, "wb") as w:
        w.write(b"x" * (sparse.CHUNK + 1000))
        w.flush()
        kill_when(child, written, "the writer never started")
    (tmp,) = new
    return tmp


def kill_when(child: subprocess.Popen, ready, what: str, timeout: float = 30.0, poll: float = 0.02) -> None:
    """Kill ``child`` with SIGKILL once ``ready()`` is true (a writer caught mid-write); fails with
    ``what`` if the child ends or ``timeout`` passes first. The child is killed (and reaped)
    whatever happens."""
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert time.monotonic() < deadline and child.poll() is None, what
            time.sleep(poll)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
