"""S3: a renamer moves the whole subtree T/A <-> T/B (with nested dirs) every ~20 ms,
W writers overwrite their own files inside it (path tried under A, then B), a reader
runs find + reads, a committer commits. Verify every file's last content, commit = tree.
usage: s3_dirrename.py MNT SECONDS WRITERS"""
import os, sys, time, errno, random, subprocess, json, multiprocessing as mp
sys.path.insert(0, os.path.dirname(__file__))
from common import *

MNT, DUR, NW = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
BR = os.path.join(MNT, "main"); T = os.path.join(BR, "s3")
SUBS = ["", "x", "x/y", "z"]


def renamer(q):
    n = 0; errs = {}; end = time.time() + DUR
    while time.time() < end:
        a, b = (os.path.join(T, "A"), os.path.join(T, "B"))
        src, dst = (a, b) if os.path.exists(a) else (b, a)
        try:
            os.rename(src, dst); n += 1
        except OSError as e:
            k = "rename %s" % errname(e); errs[k] = errs.get(k, 0) + 1
        time.sleep(0.02)
    q.put(("renamer", n, errs))


def writer(w, q):
    rnd = random.Random(w); model = {}; errs = {}; seq = 0; end = time.time() + DUR
    while time.time() < end:
        seq += 1
        rel = "%s/f%02d_%d" % (rnd.choice(SUBS), w, rnd.randrange(5))
        data = b"".join(rec(w, seq, k) for k in range(rnd.randrange(1, 20)))
        for attempt in range(6):
            top = "A" if attempt % 2 == 0 else "B"
            try:
                with open(os.path.join(T, top, rel.lstrip("/")), "wb") as f:
                    f.write(data)
                model[rel.lstrip("/")] = data
                break
            except FileNotFoundError:
                continue
            except OSError as e:
                k = "write %s" % errname(e); errs[k] = errs.get(k, 0) + 1
                # unknown outcome
                model[rel.lstrip("/")] = None
                break
        else:
            errs["gave up"] = errs.get("gave up", 0) + 1
    q.put(("writer%d" % w, seq, errs, {k: (v.decode() if v is not None else None) for k, v in model.items()}))


def reader(q):
    errs = {}; n = 0; end = time.time() + DUR; samples = []
    while time.time() < end:
        p = subprocess.run(["find", T, "-type", "f"], capture_output=True, timeout=60)
        for line in p.stderr.decode().splitlines():
            k = "find: " + line.split(":")[-1].strip(); errs[k] = errs.get(k, 0) + 1
            if len(samples) < 5: samples.append(line)
        for path in p.stdout.decode().split():
            try:
                d = open(path, "rb").read(); n += 1
            except FileNotFoundError:
                continue
            except OSError as e:
                k = "read %s" % errname(e); errs[k] = errs.get(k, 0) + 1; continue
            b = check_bytes(d)
            if b:
                errs["TORN"] = errs.get("TORN", 0) + 1
                if len(samples) < 5: samples.append("%s %s" % (path, b))
    q.put(("reader", n, errs, samples))


def committer(q):
    end = time.time() + DUR; errs = {}; n = 0
    while time.time() < end:
        try:
            with open(os.path.join(BR, ".lakefuse/commit"), "w") as f:
                f.write("s3 %d\n" % n)
            n += 1
        except OSError as e:
            k = "commit %s" % errname(e); errs[k] = errs.get(k, 0) + 1
        time.sleep(0.5)
    q.put(("committer", n, errs))


if __name__ == "__main__":
    subprocess.run(["rm", "-rf", T], timeout=120)
    for s in SUBS:
        os.makedirs(os.path.join(T, "A", s), exist_ok=True)
    q = mp.Queue()
    ps = [mp.Process(target=renamer, args=(q,)), mp.Process(target=reader, args=(q,)), mp.Process(target=committer, args=(q,))]
    ps += [mp.Process(target=writer, args=(w, q)) for w in range(NW)]
    res = run_all(q, ps, DUR + 120)
    model = {}
    for r in res:
        print(r[:3], r[3] if r[0] == "reader" else "")
        if r[0].startswith("writer"): model.update(r[3])
    tops = sorted(os.listdir(T)); print("tops", tops)
    top = os.path.join(T, tops[0])
    bad = 0
    actual = {}
    for dp, dn, fn in os.walk(top):
        for f in fn:
            actual[os.path.relpath(os.path.join(dp, f), top)] = open(os.path.join(dp, f), "rb").read().decode()
    for k in sorted(set(model) | set(actual)):
        if model.get(k) is None and k in model:
            continue  # unknown outcome
        if model.get(k) != actual.get(k):
            bad += 1
            if bad < 10: print("MISMATCH", k, None if model.get(k) is None else len(model[k]), None if actual.get(k) is None else len(actual[k]))
    print("files", len(model), len(actual), "mismatches", bad)
    with open(os.path.join(BR, ".lakefuse/commit"), "w") as f:
        f.write("s3 final\n")
    head = open(os.path.join(BR, ".lakefuse/head")).read().strip()
    d = subprocess.run(["diff", "-r", T, os.path.join(MNT, head, "s3")], capture_output=True, timeout=120)
    print("diff -r rc", d.returncode, d.stdout.decode()[:500], d.stderr.decode()[:300])
    print("status", repr(open(os.path.join(BR, ".lakefuse/status")).read()[:300]))
