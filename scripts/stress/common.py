"""Shared helpers for the stress drivers."""
import hashlib, os, json, time, errno, subprocess

REC = 64
L = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".venv", "bin", "lakefuse")
HOME = os.environ.get("LAKEFUSE_HOME", "/tmp/lakefuse-stress/home")  # the mounted repository's home
WORK = os.environ.get("STRESS_WORK", "/tmp/lakefuse-stress")  # the drivers' records and scratch files
ENV = dict(os.environ, LAKEFUSE_HOME=HOME)


def rec(w, seq, k):
    """A 64-byte self-checking record."""
    head = "w%02d s%08d k%04d " % (w, seq, k)
    body = head.encode()
    h = hashlib.md5(body).hexdigest()
    pad = (h * 4)[: REC - len(body) - 1]
    return body + pad.encode() + b"\n"


def check_bytes(data, owner=None):
    """Return None if data is a whole number of valid records (of owner), else a description."""
    if len(data) % REC:
        return "size %d not multiple of %d" % (len(data), REC)
    for i in range(0, len(data), REC):
        r = data[i : i + REC]
        try:
            s = r.decode()
            w = int(s[1:3]); seq = int(s[5:13]); k = int(s[15:19])
        except Exception:
            return "unparsable record at %d: %r" % (i, r[:40])
        if rec(w, seq, k) != r:
            return "bad record at %d: %r" % (i, r[:40])
        if owner is not None and w != owner:
            return "record of writer %d in file of %d at %d" % (w, owner, i)
    return None


def cli(*args, timeout=60, check=False):
    p = subprocess.run([L, *args], env=ENV, capture_output=True, timeout=timeout)
    if check and p.returncode:
        raise RuntimeError("%s -> %d %s" % (args, p.returncode, p.stderr.decode()))
    return p


def log_err(path, msg):
    with open(path, "a") as f:
        f.write("%.3f %d %s\n" % (time.time(), os.getpid(), msg))


def errname(e):
    return errno.errorcode.get(e.errno, str(e.errno)) if isinstance(e, OSError) else type(e).__name__


def run_all(q, procs, timeout):
    """Start the worker processes, take one result each from queue ``q`` (each puts one), join them."""
    for p in procs:
        p.start()
    res = [q.get(timeout=timeout) for _ in procs]
    for p in procs:
        p.join(10)
    return res
