"""The event loop's spin for the next request (``$LAKEFUSE_RECEIVE_SPIN_US``, the patched
pyfuse3's ``Operations.receive_spin_us``): after answering a request with no handler
waiting, the trio thread reads the FUSE fd again outside the GIL for a while before it
sleeps, so a process that waits for each answer (a small-file writer, ``ls``, ``stat``)
has its next request read without a wake-up. What it must not do: delay the answer of a
handler that waits for a worker thread (no spin while one waits), change what a mount
serves, or accept a bad setting silently. Real mounts."""

from __future__ import annotations

import json
import os
import statistics
import threading
import time

import pytest

from tests.mount_core_testutil import seeded_repo
from tests.mount_testutil import MountProc, clean_mount, needs_fuse

FILES = {f"d/f{i:02d}": f"file {i}\n".encode() * (i + 1) for i in range(4)}


@pytest.fixture
def repo(tmp_path, request):
    with seeded_repo(tmp_path, "spin", FILES, request) as r:
        yield r


def _stats(mp) -> dict:
    return json.loads((mp / ".lakefuse" / "stats").read_text())


def _write_files(d, n: int) -> dict[str, bytes]:
    d.mkdir(exist_ok=True)
    out = {}
    for i in range(n):
        data = os.urandom(4096 + i)
        (d / f"w{i:03d}").write_bytes(data)
        out[f"w{i:03d}"] = data
    return out


def _reads_back(mp, written: dict[str, bytes]) -> None:
    """What was written through the mount, and the commit's files, read back as they are."""
    for name, data in written.items():
        assert (mp / "main" / "new" / name).read_bytes() == data
    for name, data in FILES.items():
        assert (mp / "v1" / name).read_bytes() == data


@needs_fuse
def test_a_writer_waiting_for_each_answer_has_its_next_request_read_by_the_spin(repo, tmp_path):
    import pyfuse3

    assert hasattr(pyfuse3, "receive_spin_stats"), "scripts/setup.sh builds the pyfuse3 that spins"
    with clean_mount(repo.config.home, "spin", tmp_path / "mnt") as mp:
        spin = _stats(mp)["receive_spin"]
        assert spin["us"] == 500  # the default
        written = _write_files(mp / "main" / "new", 100)
        after = _stats(mp)["receive_spin"]
        # each small file is six requests from one process that waits for every answer: the
        # loop found most of them while it spun (some may come late on a loaded machine)
        assert after["caught"] > spin["caught"]
        assert after["caught"] + after["expired"] > spin["caught"] + spin["expired"]
        assert after["seconds"] >= spin["seconds"]
        _reads_back(mp, written)


@needs_fuse
def test_a_handler_waiting_for_a_thread_is_answered_without_waiting_for_a_spin(repo, tmp_path):
    # Two processes: a mkdir (a worker thread's job) and a stat of the branch's directory (no
    # attribute cache: --branch-timeout 0) while it runs. Were the event loop to spin after one
    # answer while the other request waits for its thread (100 ms here, and no request
    # follows), that other answer would wait for the spin to end.
    with clean_mount(repo.config.home, "spin", tmp_path / "mnt", "--branch-timeout", "0",
                     env={"LAKEFUSE_RECEIVE_SPIN_US": "100000"}) as mp:
        assert _stats(mp)["receive_spin"]["us"] == 100000
        took = []
        for i in range(9):
            done = []
            t = threading.Thread(target=lambda i=i: (os.mkdir(mp / "main" / f"dir{i}"), done.append(time.perf_counter())))
            t0 = time.perf_counter()
            t.start()
            time.sleep(0.001)
            os.stat(mp / "main")
            stat_end = time.perf_counter()
            t.join(10)
            took.append(max(done[0], stat_end) - t0)
            time.sleep(0.15)  # (the spin after the last answer is over)
        assert statistics.median(took) < 0.05, took
        assert sorted(n for n in os.listdir(mp / "main") if n.startswith("dir")) == sorted(f"dir{i}" for i in range(9))


@needs_fuse
def test_no_spin_serves_the_same_and_a_bad_setting_stops_the_mount(repo, tmp_path):
    with clean_mount(repo.config.home, "spin", tmp_path / "mnt", env={"LAKEFUSE_RECEIVE_SPIN_US": "0"}) as mp:
        assert _stats(mp)["receive_spin"] == "off"
        written = _write_files(mp / "main" / "new", 20)
        _reads_back(mp, written)
    for bad in ("abc", "-5", "100001"):
        with pytest.raises(RuntimeError, match="LAKEFUSE_RECEIVE_SPIN_US: expected microseconds from 0 to 100000"):
            MountProc(repo.config.home, "spin", tmp_path / "mnt2", env={"LAKEFUSE_RECEIVE_SPIN_US": bad}).start()


def test_a_daemon_allowed_one_cpu_does_not_spin_unless_asked(monkeypatch):
    from lakefuse.mount import daemon

    monkeypatch.delenv("LAKEFUSE_RECEIVE_SPIN_US", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert daemon.MountConfig("spin", "/mnt").receive_spin_us == 0
    monkeypatch.setenv("LAKEFUSE_RECEIVE_SPIN_US", "200")
    assert daemon.MountConfig("spin", "/mnt").receive_spin_us == 200
    monkeypatch.delenv("LAKEFUSE_RECEIVE_SPIN_US")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert daemon.MountConfig("spin", "/mnt").receive_spin_us == daemon.RECEIVE_SPIN_US == 500
