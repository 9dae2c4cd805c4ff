"""S4: minimal: writers create files by path in T/A/z (until ENOENT) while the main process
renames T/A -> T/B once. Afterwards the old name A must not exist and every file whose
create+close succeeded must be under B/z (rename moves the whole directory; POSIX).
usage: s4_rename_create.py DIR TRIALS WRITERS"""
import os, sys, time, errno, subprocess, multiprocessing as mp

D, TRIALS, NW = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


def writer(t, w, q):
    made = []; errs = []
    for i in range(100000):
        p = os.path.join(D, "t%d" % t, "A", "z", "f%d_%d" % (w, i))
        try:
            with open(p, "wb") as f:
                f.write(b"x" * 100)
            made.append("f%d_%d" % (w, i))
        except FileNotFoundError:
            break
        except OSError as e:
            errs.append(str(e)); break
    q.put((made, errs))


if __name__ == "__main__":
    bad_trials = 0
    for t in range(TRIALS):
        base = os.path.join(D, "t%d" % t)
        os.makedirs(os.path.join(base, "A", "z"))
        q = mp.Queue()
        ps = [mp.Process(target=writer, args=(t, w, q)) for w in range(NW)]
        for p in ps: p.start()
        time.sleep(0.3)
        os.rename(os.path.join(base, "A"), os.path.join(base, "B"))
        res = [q.get(timeout=60) for _ in ps]
        for p in ps: p.join(10)
        made = sorted(sum((r[0] for r in res), []))
        errs = sum((r[1] for r in res), [])
        time.sleep(1.2)
        a_exists = os.path.exists(os.path.join(base, "A"))
        inb = set(os.listdir(os.path.join(base, "B", "z")))
        ina = set(os.listdir(os.path.join(base, "A", "z"))) if os.path.exists(os.path.join(base, "A", "z")) else set()
        missing = [m for m in made if m not in inb]
        ok = not a_exists and not missing and not errs
        if not ok:
            bad_trials += 1
        print("trial %d: made %d, in B/z %d, A exists %s (A/z has %d: %s), missing from B/z %d, errs %s" % (
            t, len(made), len(inb), a_exists, len(ina), sorted(ina)[:4], len(missing), errs[:3]))
    print("BAD TRIALS %d/%d" % (bad_trials, TRIALS))
