"""S2: one file, one writer process, R reader processes.
mode append:  writer appends one 64-byte record per open/close ("ab").
mode over:    writer rewrites the file whole ("wb", n records).
mode trunc:   writer alternates: rewrite with 30 records, then os.truncate to fewer.
Readers open/read/close in a loop and check every read is whole valid records and
not longer than any version; all errors are counted.
usage: s2_one_file.py DIR MODE SECONDS READERS"""
import os, sys, time, errno, random, multiprocessing as mp
sys.path.insert(0, os.path.dirname(__file__))
from common import *

D, MODE, DUR, NR = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
P = os.path.join(D, "one_%s" % MODE)


def writer(q):
    errs = {}; seq = 0; end = time.time() + DUR; rnd = random.Random(1); failed = []
    while time.time() < end:
        seq += 1
        try:
            if MODE == "append":
                with open(P, "ab") as f:
                    f.write(rec(1, seq, 0))
            elif MODE == "over":
                with open(P, "wb") as f:
                    f.write(b"".join(rec(1, seq, k) for k in range(rnd.randrange(1, 30))))
            elif MODE == "trunc":
                if seq % 2:
                    with open(P, "wb") as f:
                        f.write(b"".join(rec(1, seq, k) for k in range(30)))
                else:
                    os.truncate(P, REC * rnd.randrange(0, 30))
        except OSError as e:
            k = "writer %s %s" % (MODE, errname(e)); errs[k] = errs.get(k, 0) + 1
            failed.append(seq)
    q.put(("writer", seq, errs))
    if MODE == "append":
        time.sleep(1.5)
        d = open(P, "rb").read()
        got = [int(d[i+5:i+13]) for i in range(0, len(d), REC)]
        exp = [s for s in range(0, seq + 1) if s not in set(failed)]
        print("APPEND CHECK: records", len(got), "expected", len(exp), "bad", check_bytes(d, 1))
        if got != exp:
            print("  failed near missing", [f for f in failed if any(abs(f-m)<4 for m in set(exp)-set(got))]); print("  missing", sorted(set(exp) - set(got))[:20], "extra", sorted(set(got) - set(exp))[:20], "dups", len(got) - len(set(got)))


def reader(i, q):
    errs = {}; n = 0; end = time.time() + DUR; samples = []
    while time.time() < end:
        try:
            with open(P, "rb") as f:
                st0 = os.fstat(f.fileno())
                data = f.read()
                st1 = os.fstat(f.fileno())
            n += 1
        except OSError as e:
            k = "reader %s" % errname(e); errs[k] = errs.get(k, 0) + 1
            continue
        bad = check_bytes(data, 1)
        if bad:
            k = "TORN"; errs[k] = errs.get(k, 0) + 1
            if len(samples) < 5:
                samples.append("len=%d fstat-before=%d after=%d nlink=%d/%d: %s" % (
                    len(data), st0.st_size, st1.st_size, st0.st_nlink, st1.st_nlink, bad[:80]))
    q.put(("reader%d" % i, n, errs, samples))


if __name__ == "__main__":
    if MODE == "append" and os.path.exists(P):
        os.unlink(P)
    with open(P, "wb") as f:
        f.write(rec(1, 0, 0))
    q = mp.Queue()
    ps = [mp.Process(target=writer, args=(q,))] + [mp.Process(target=reader, args=(i, q)) for i in range(NR)]
    res = run_all(q, ps, DUR + 120)
    for r in res: print(r)
