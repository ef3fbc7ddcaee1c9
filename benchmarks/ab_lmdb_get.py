"""Paired A/B: LMDB records of a batch fetched by a loop of ``txn.get`` (fastdata.format.lmdb's _get_many) against
one ``Cursor.getmulti``, on 6,000 ragged float32 sequences (10-100 rows of 16), ``get_batch`` epochs of random
batches of 64, order alternating per round. Prints the paired ratio (loop / getmulti).

Usage: python benchmarks/ab_lmdb_get.py
"""
import time, tempfile, shutil, statistics
from pathlib import Path
import numpy as np, fastdata, lmdb
from fastdata.format import lmdb as L
from fastdata.errors import CorruptShardError
work = Path(tempfile.mkdtemp()); rng = np.random.default_rng(0); src = work / "seq"; src.mkdir()
N=6000
for i in range(N):
    np.save(src / f"{i:06d}.npy", rng.standard_normal((int(rng.integers(10, 101)), 16)).astype(np.float32))
fastdata.convert(src, work / "lmdb", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="lmdb"), no_labels=True))
ds = fastdata.open(work / "lmdb")
plan = [np.sort(p) for p in np.array_split(np.random.default_rng(1).permutation(N), N // 64)]
def multi(self, txn, local):
    raw = (local.astype(np.int64) + self.info.stored_start).astype(">u8").tobytes()
    found = txn.cursor().getmulti([raw[k : k + 8] for k in range(0, len(raw), 8)])
    return [v for _, v in found]
orig = multi
def loop_get(self, txn, local):
    raw = (local.astype(np.int64) + self.info.stored_start).astype(">u8").tobytes()
    get = txn.get
    try:
        out = [get(raw[k : k + 8]) for k in range(0, len(raw), 8)]
    except lmdb.Error as e:
        raise CorruptShardError(f"{self._where()}: LMDB read failed ({e})") from None
    if None in out:
        for l in local.tolist(): self._get(txn, l)
    return out
variants = {"getmulti": orig, "txn.get loop": loop_get}
res = {k: [] for k in variants}
for r in range(12):
    for name in (list(variants) if r % 2 else list(variants)[::-1]):
        L.ShardReader._get_many = variants[name]
        t0 = time.perf_counter()
        for _ in range(3): [ds.get_batch(p) for p in plan]
        if r: res[name].append(3 * N / (time.perf_counter() - t0))
for k, v in res.items(): print(k, f"{statistics.median(v):,.0f}", f"{min(v):,.0f}-{max(v):,.0f}")
ratios = [a / b for a, b in zip(res["txn.get loop"], res["getmulti"])]
print("paired loop/getmulti median", round(statistics.median(ratios), 3), "range", round(min(ratios), 3), round(max(ratios), 3))
shutil.rmtree(work)
