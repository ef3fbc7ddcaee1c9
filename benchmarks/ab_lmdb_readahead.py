"""One-off paired A/B: cold LMDB loader pass with the reader's env opened readahead=False (as now) vs True."""
import os, sys, time, statistics
import numpy as np
import lmdb
import fastdata

ROOT = sys.argv[1]; N = int(sys.argv[2]); ROUNDS = int(sys.argv[3])
src = os.path.join(ROOT, "src"); dst = os.path.join(ROOT, "ds")
if not os.path.exists(dst):
    os.makedirs(src, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(N):
        np.save(os.path.join(src, f"{i:05d}.npy"), rng.random((2, 256, 21, 21), dtype=np.float32))
    fastdata.convert(src, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="lmdb")))
_open = lmdb.open
def drop():
    os.sync(); open("/proc/sys/vm/drop_caches", "w").write("3\n")
def one(ra):
    lmdb.open = lambda *a, **k: _open(*a, **{**k, "readahead": ra})
    drop()
    t = time.perf_counter(); n = 0
    with fastdata.loader(dst, 32, shuffle=True, device="cpu", num_workers=2) as ld:
        for b in ld:
            n += len(b["x"]) if "x" in b else len(next(iter(b.values())))
    return n / (time.perf_counter() - t)
res = {False: [], True: []}
for r in range(ROUNDS):
    for ra in ((False, True) if r % 2 == 0 else (True, False)):
        res[ra].append(one(ra)); print(r, ra, round(res[ra][-1]), flush=True)
for ra, v in res.items():
    print(f"readahead={ra}: median {statistics.median(v):.0f} samples/s, min {min(v):.0f}, max {max(v):.0f}")
