"""S6: the CLI changes branch BR (fs upload / fs rm of its own files cli_k, commit,
branch create/delete of side branches) while through the mount W writers overwrite their
own files in the same directory and R readers read everything there. Readers must see
only whole versions; errors other than ENOENT are defects. Verify last content.
usage: s6_cli.py MNT BRANCH SECONDS W R"""
import os, sys, time, random, subprocess, tempfile, multiprocessing as mp
sys.path.insert(0, os.path.dirname(__file__))
from common import *

MNT, BRN, DUR, NW, NR = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
T = os.path.join(MNT, BRN, "s6")
URI = "lakefs://stress/%s/s6/" % BRN


def cli_worker(q):
    rnd = random.Random(5); model = {}; errs = {}; seq = 0; end = time.time() + DUR
    os.makedirs(WORK, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=WORK)
    while time.time() < end:
        seq += 1
        k = "cli_%d" % rnd.randrange(4)
        op = rnd.choice(["up", "up", "up", "rm", "commit", "branch"])
        if op == "up":
            data = b"".join(rec(50, seq, i) for i in range(rnd.randrange(1, 200)))
            src = os.path.join(tmp, "src"); open(src, "wb").write(data)
            p = cli("fs", "upload", URI + k, "--source", src)
            if p.returncode == 0: model[k] = data
        elif op == "rm":
            p = cli("fs", "rm", URI + k)
            if p.returncode == 0: model.pop(k, None)
            elif p.returncode == 3: p = None
        elif op == "commit":
            p = cli("commit", "lakefs://stress/%s" % BRN, "-m", "cli %d" % seq)
            if p.returncode == 4 or b"no changes" in p.stderr.lower(): p = None
        else:
            b = "side%d" % (seq % 3)
            p = cli("branch", "create", "lakefs://stress/%s" % b, "--source", BRN)
            if p.returncode == 0:
                p = cli("branch", "delete", "lakefs://stress/%s" % b, "--yes")
                if p.returncode: p = cli("branch", "delete", "lakefs://stress/%s" % b)
        if p is not None and p.returncode:
            kk = "cli %s rc=%d %s" % (op, p.returncode, p.stderr.decode().strip()[:120]); errs[kk] = errs.get(kk, 0) + 1
    q.put(("cli", seq, errs, {k: v.decode() for k, v in model.items()}))


def writer(w, q):
    rnd = random.Random(w); model = {}; errs = {}; seq = 0; end = time.time() + DUR
    while time.time() < end:
        seq += 1
        k = "w%02d_%d" % (w, rnd.randrange(3))
        data = b"".join(rec(w, seq, i) for i in range(rnd.randrange(1, 50)))
        try:
            with open(os.path.join(T, k), "wb") as f:
                f.write(data)
            model[k] = data
        except OSError as e:
            kk = "write %s" % errname(e); errs[kk] = errs.get(kk, 0) + 1; model[k] = None
    q.put(("writer%d" % w, seq, errs, {k: (v.decode() if v else v) for k, v in model.items()}))


def reader(r, q):
    n = 0; errs = {}; end = time.time() + DUR; samples = []
    while time.time() < end:
        try:
            names = os.listdir(T)
        except OSError as e:
            kk = "listdir %s" % errname(e); errs[kk] = errs.get(kk, 0) + 1; continue
        for nm in names:
            try:
                d = open(os.path.join(T, nm), "rb").read(); n += 1
            except FileNotFoundError:
                continue
            except OSError as e:
                kk = "read %s %s" % (nm[:3], errname(e)); errs[kk] = errs.get(kk, 0) + 1; continue
            b = check_bytes(d)
            if b:
                errs["TORN"] = errs.get("TORN", 0) + 1
                if len(samples) < 5: samples.append("%s len=%d %s" % (nm, len(d), b[:60]))
    q.put(("reader%d" % r, n, errs, samples))


if __name__ == "__main__":
    os.makedirs(T, exist_ok=True)
    q = mp.Queue()
    ps = [mp.Process(target=cli_worker, args=(q,))] + [mp.Process(target=writer, args=(w, q)) for w in range(NW)]
    ps += [mp.Process(target=reader, args=(r, q)) for r in range(NR)]
    res = run_all(q, ps, DUR + 180)
    model = {}
    for r in res:
        print(r[:3], r[3] if r[0].startswith("reader") else "")
        if not r[0].startswith("reader"):
            model.update(r[3])
    time.sleep(1.5)
    bad = 0
    actual = {nm: open(os.path.join(T, nm), "rb").read().decode() for nm in os.listdir(T)}
    for k in sorted(set(model) | set(actual)):
        if k in model and model[k] is None: continue
        if model.get(k) != actual.get(k):
            bad += 1; print("MISMATCH", k, len(model.get(k) or ""), len(actual.get(k) or ""))
    print("files", len(model), len(actual), "mismatches", bad)
    p = cli("fs", "ls", URI)
    print("cli ls rc", p.returncode, len(p.stdout.decode().splitlines()))
