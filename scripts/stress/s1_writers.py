"""S1: N writers doing create/overwrite/append/pwrite/truncate/rename/unlink of their own
files in shared directories of main, a committer every 0.5 s, readers checking every
file they read is whole records, a stat/listdir walker. Then verify."""
import os, sys, random, time, json, errno, subprocess, multiprocessing as mp
sys.path.insert(0, os.path.dirname(__file__))
from common import *

MNT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(WORK, "mnt")
DUR = float(sys.argv[2]) if len(sys.argv) > 2 else 60
NW = int(sys.argv[3]) if len(sys.argv) > 3 else 6
TOP = sys.argv[4] if len(sys.argv) > 4 else "s1"
BR = os.path.join(MNT, os.environ.get("BRANCH", "main"))
ROOT = os.path.join(BR, TOP)
OUT = os.path.join(WORK, "out_" + TOP)
DIRS = ["d0", "d1", "d2", "d0/sub", "d3/x/y"]
NAMES = 6


def writer(w):
    rnd = random.Random(w * 7919 + int(time.time()))
    model = {}  # relpath -> bytes
    seq = 0
    errs = os.path.join(OUT, "err_w%d" % w)
    end = time.time() + DUR
    nops = 0
    jr = open(os.path.join(OUT, "journal_w%d" % w), "w", buffering=1)
    dst = None
    def path(rel):
        return os.path.join(ROOT, rel)
    while time.time() < end:
        seq += 1
        rel = "%s/w%02d_%d" % (rnd.choice(DIRS), w, rnd.randrange(NAMES))
        op = rnd.choice(["over", "over", "append", "append", "pwrite", "trunc", "rename", "unlink", "fsync"])
        try:
            if op == "over":
                n = rnd.randrange(0, 40)
                data = b"".join(rec(w, seq, k) for k in range(n))
                with open(path(rel), "wb") as f:
                    # several writes
                    for i in range(0, len(data), REC * 8):
                        f.write(data[i:i + REC * 8]); f.flush()
                model[rel] = data
            elif op == "append":
                r = rec(w, seq, 0)
                with open(path(rel), "ab") as f:
                    f.write(r)
                model[rel] = model.get(rel, b"") + r
            elif op == "pwrite":
                if rel not in model or not model[rel]:
                    continue
                n = len(model[rel]) // REC
                k = rnd.randrange(n)
                r = rec(w, seq, k)
                fd = os.open(path(rel), os.O_RDWR)
                try:
                    os.pwrite(fd, r, k * REC)
                finally:
                    os.close(fd)
                m = bytearray(model[rel]); m[k * REC:(k + 1) * REC] = r; model[rel] = bytes(m)
            elif op == "trunc":
                if rel not in model:
                    continue
                n = len(model[rel]) // REC
                k = rnd.randrange(n + 1)
                os.truncate(path(rel), k * REC)
                model[rel] = model[rel][:k * REC]
            elif op == "rename":
                if rel not in model:
                    continue
                dst = "%s/w%02d_%d" % (rnd.choice(DIRS), w, rnd.randrange(NAMES))
                if dst == rel:
                    continue
                os.rename(path(rel), path(dst))
                model[dst] = model.pop(rel)
            elif op == "unlink":
                if rel not in model:
                    continue
                os.unlink(path(rel))
                del model[rel]
            elif op == "fsync":
                if rel not in model:
                    continue
                r = rec(w, seq, 1)
                with open(path(rel), "ab") as f:
                    f.write(r); f.flush(); os.fsync(f.fileno())
                    model[rel] = model.get(rel, b"") + r
            nops += 1
            jr.write("%.4f %d %s %s %s %d\n" % (time.time(), seq, op, rel, dst if op == "rename" else "-", len(model.get(dst if op == "rename" else rel, b""))))
            # read back sometimes
            if rnd.random() < 0.3:
                for p_rel in [rel] + ([dst] if op == "rename" else []):
                    exp = model.get(p_rel)
                    try:
                        with open(path(p_rel), "rb") as f:
                            got = f.read()
                    except FileNotFoundError:
                        got = None
                    if got != exp:
                        log_err(errs, "READBACK after %s seq=%d %s: expected %s got %s" % (
                            op, seq, p_rel, None if exp is None else len(exp), None if got is None else (len(got), check_bytes(got, w))))
                        if got is not None and exp is not None:
                            log_err(errs, "   exp-head %r got-head %r" % (exp[:70], got[:70]))
        except OSError as e:
            jr.write("%.4f %d %s %s ERR %s\n" % (time.time(), seq, op, rel, errname(e)))
            log_err(errs, "OP %s seq=%d %s: %s %s" % (op, seq, rel, errname(e), e))
            # resync model with reality for this file
            try:
                with open(path(rel), "rb") as f:
                    model[rel] = f.read()
            except OSError:
                model.pop(rel, None)
    with open(os.path.join(OUT, "model_w%d.json" % w), "w") as f:
        json.dump({k: v.decode() for k, v in model.items()}, f)
    with open(os.path.join(OUT, "ops_w%d" % w), "w") as f:
        f.write("%d\n" % nops)


def committer():
    errs = os.path.join(OUT, "err_commit")
    end = time.time() + DUR
    n = ok = busy = 0
    while time.time() < end:
        n += 1
        t0 = time.time()
        try:
            fd = os.open(os.path.join(BR, ".lakefuse/commit"), os.O_WRONLY | os.O_TRUNC)
            try:
                os.write(fd, b"c%d\n" % n)
                ok += 1
            finally:
                os.close(fd)
            with open(os.path.join(OUT, "commitlog"), "a") as cl:
                cl.write("%.4f %.4f c%d\n" % (t0, time.time(), n))
        except OSError as e:
            if e.errno == errno.EBUSY:
                busy += 1
            else:
                log_err(errs, "commit %d: %s %s" % (n, errname(e), e))
        time.sleep(0.5)
    with open(os.path.join(OUT, "commits"), "w") as f:
        f.write("ok=%d busy=%d n=%d\n" % (ok, busy, n))


def reader(i):
    errs = os.path.join(OUT, "err_r%d" % i)
    end = time.time() + DUR
    reads = 0
    while time.time() < end:
        for d in DIRS:
            try:
                names = os.listdir(os.path.join(ROOT, d))
            except OSError as e:
                log_err(errs, "listdir %s: %s" % (d, errname(e))); continue
            for nm in names:
                p = os.path.join(ROOT, d, nm)
                if os.path.isdir(p) or not nm.startswith("w"):
                    continue
                owner = int(nm[1:3])
                tr = time.time()
                try:
                    with open(p, "rb") as f:
                        data = f.read()
                        st = os.fstat(f.fileno())
                    reads += 1
                except FileNotFoundError:
                    continue
                except OSError as e:
                    log_err(errs, "read %s/%s: %s %s" % (d, nm, errname(e), e)); continue
                bad = check_bytes(data, owner)
                if bad:
                    log_err(errs, "TORN %s/%s t0=%.4f len=%d st_size=%d ino=%d nlink=%d: %s" % (d, nm, tr, len(data), st.st_size, st.st_ino, st.st_nlink, bad))
    with open(os.path.join(OUT, "reads_r%d" % i), "w") as f:
        f.write("%d\n" % reads)


def walker():
    errs = os.path.join(OUT, "err_walk")
    end = time.time() + DUR
    while time.time() < end:
        for dp, dns, fns in os.walk(ROOT, onerror=lambda e: log_err(errs, "walk %s" % e)):
            for fn in fns:
                try:
                    st = os.lstat(os.path.join(dp, fn))
                    if st.st_size % REC:
                        # may be legitimate mid-write? records are written whole
                        log_err(errs, "stat size %d of %s/%s not multiple" % (st.st_size, dp, fn))
                except FileNotFoundError:
                    pass
                except OSError as e:
                    log_err(errs, "lstat %s/%s: %s" % (dp, fn, errname(e)))


def main():
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        os.unlink(os.path.join(OUT, f))
    for d in DIRS:
        os.makedirs(os.path.join(ROOT, d), exist_ok=True)
    procs = [mp.Process(target=writer, args=(w,)) for w in range(NW)]
    procs += [mp.Process(target=committer), mp.Process(target=reader, args=(0,)),
              mp.Process(target=reader, args=(1,)), mp.Process(target=walker)]
    for p in procs: p.start()
    t0 = time.time()
    for p in procs:
        p.join(max(1, DUR + 120 - (time.time() - t0)))
    hung = [p.pid for p in procs if p.is_alive()]
    if hung:
        print("HUNG processes:", hung)
        for p in procs:
            if p.is_alive():
                subprocess.run(["cat", "/proc/%d/stack" % p.pid]); subprocess.run(["cat", "/proc/%d/wchan" % p.pid]); print()
                p.kill()
    print("exitcodes", [p.exitcode for p in procs])
    verify()


def verify():
    problems = []
    # error logs
    for f in sorted(os.listdir(OUT)):
        if f.startswith("err_"):
            lines = open(os.path.join(OUT, f)).read().splitlines()
            print("== %s: %d lines" % (f, len(lines)))
            for l in lines[:15]: print("   ", l)
    for f in sorted(os.listdir(OUT)):
        if f.startswith(("ops_", "reads_", "commits")):
            print(f, open(os.path.join(OUT, f)).read().strip())
    # model vs tree
    actual = {}
    for dp, dns, fns in os.walk(ROOT):
        for fn in fns:
            rel = os.path.relpath(os.path.join(dp, fn), ROOT)
            actual[rel] = open(os.path.join(dp, fn), "rb").read()
    expected = {}
    for w in range(NW):
        p = os.path.join(OUT, "model_w%d.json" % w)
        if os.path.exists(p):
            expected.update({k: v.encode() for k, v in json.load(open(p)).items()})
    for k in sorted(set(actual) | set(expected)):
        a, e = actual.get(k), expected.get(k)
        if a != e:
            problems.append("MISMATCH %s: expected %s got %s" % (k, None if e is None else len(e), None if a is None else (len(a), check_bytes(a))))
    print("files expected %d actual %d mismatches %d" % (len(expected), len(actual), len(problems)))
    for p in problems[:30]: print("  ", p)
    # final commit
    try:
        with open(os.path.join(BR, ".lakefuse/commit"), "w") as f:
            f.write("final %s\n" % TOP)
    except OSError as e:
        print("final commit:", errname(e))
    head = open(os.path.join(BR, ".lakefuse/head")).read().strip()
    print("head", head)
    d = subprocess.run(["diff", "-r", ROOT, os.path.join(MNT, head, TOP)], capture_output=True, timeout=120)
    print("diff -r branch vs commit rc=%d %s" % (d.returncode, d.stdout.decode()[:2000] + d.stderr.decode()[:500]))
    p = cli("diff", "lakefs://stress/" + os.environ.get("BRANCH", "main"))
    print("lakefuse diff rc=%d out=%r err=%r" % (p.returncode, p.stdout.decode()[:500], p.stderr.decode()[:300]))
    st = open(os.path.join(BR, ".lakefuse/status")).read()
    print("status: %r" % st[:500])


if __name__ == "__main__":
    if len(sys.argv) > 5 and sys.argv[5] == "verify":
        verify()
    else:
        main()
