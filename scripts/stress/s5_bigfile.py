"""S5: R readers read a 100 MB file whole, over and over, while a writer writes a new
version to a temp name and renames it over (tmp -> big). Every read must be exactly one
version (all 1 MiB blocks carry the same version number, size 100 MiB).
usage: s5_bigfile.py DIR SECONDS READERS [MB]"""
import os, sys, time, struct, multiprocessing as mp
sys.path.insert(0, os.path.dirname(__file__))
from common import run_all
D, DUR, NR = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
MB = int(sys.argv[4]) if len(sys.argv) > 4 else 100
BIG = os.path.join(D, "big"); BLK = 1 << 20


def content(v):
    return b"".join(struct.pack(">QQ", v, i) * (BLK // 16) for i in range(MB))


def writer(q):
    v = 1; errs = {}; end = time.time() + DUR
    while time.time() < end:
        v += 1
        tmp = os.path.join(D, "big.tmp")
        try:
            with open(tmp, "wb") as f:
                c = content(v)
                for i in range(0, len(c), BLK):
                    f.write(c[i:i + BLK])
            os.rename(tmp, BIG)
        except OSError as e:
            k = "writer %s" % e.strerror; errs[k] = errs.get(k, 0) + 1
        time.sleep(0.5)
    q.put(("writer", v, errs))


def reader(r, q):
    n = 0; errs = {}; end = time.time() + DUR; samples = []
    while time.time() < end:
        try:
            with open(BIG, "rb") as f:
                vs = set(); size = 0; i = 0
                while True:
                    b = f.read(BLK)
                    if not b: break
                    size += len(b)
                    for off in (0, len(b) - 16):
                        if len(b) >= 16:
                            v, blk = struct.unpack(">QQ", b[off:off + 16]); vs.add(v)
                            if blk != i: vs.add(("blk", blk, i))
                    if b.count(b"\0" * 4096) > 1 and i > 0: vs.add("zeros")
                    i += 1
            n += 1
            if len(vs) != 1 or size != MB * BLK:
                errs["TORN"] = errs.get("TORN", 0) + 1
                if len(samples) < 5: samples.append((size, sorted(map(str, vs))[:6]))
        except OSError as e:
            k = "reader %s" % e.strerror; errs[k] = errs.get(k, 0) + 1
    q.put(("reader%d" % r, n, errs, samples))


if __name__ == "__main__":
    with open(BIG, "wb") as f:
        f.write(content(1))
    q = mp.Queue()
    ps = [mp.Process(target=writer, args=(q,))] + [mp.Process(target=reader, args=(r, q)) for r in range(NR)]
    res = run_all(q, ps, DUR + 180)
    for r in res: print(r)
