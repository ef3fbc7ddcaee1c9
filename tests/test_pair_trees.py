"""benchmarks/pair_trees.py, the paired before/after run of two trees: its run order, its verdict and its row
matching. No benchmark runs here (the parsers meet the scripts' real output in tests/test_benchmarks.py and
tests/test_bench_cold.py); no timing is asserted."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    import pair_trees
finally:
    sys.path.pop(0)


def test_each_benchmark_alternates_which_tree_goes_first_from_round_to_round():
    order = pair_trees.schedule({"loader": 3, "raw": 2, "cold": 1})
    assert order == [("loader", 0, "before"), ("loader", 0, "after"), ("raw", 0, "after"), ("raw", 0, "before"),
                     ("cold", 0, "before"), ("cold", 0, "after"),
                     ("loader", 1, "after"), ("loader", 1, "before"), ("raw", 1, "before"), ("raw", 1, "after"),
                     ("loader", 2, "before"), ("loader", 2, "after")]


def test_slower_beyond_spread_only_when_each_median_is_outside_the_other_sides_range():
    assert pair_trees.verdict([10, 11, 12], [7, 8, 9]) == "YES"
    assert pair_trees.verdict([10, 11, 12], [8, 9, 11.5]) == "no"  # an after pass above before's median
    assert pair_trees.verdict([10, 11, 12], [12.5, 13, 14]) == "no (faster beyond spread)"
    assert pair_trees.verdict([10], [5, 6]) == "n/a (1 pass)"


def test_rows_are_matched_by_name_and_pooled_over_rounds():
    def run(rows):
        return {"rows": {k: ("samples/s", v) for k, v in rows.items()}, "size": "s"}

    before = [run({"a": [10, 12], "gone": [1, 1]}), run({"a": [11, 13], "gone": [1, 1]})]
    after = [run({"a": [5, 6], "new": [2, 2]}), {"rc": 1, "error": "no JSON"}]
    rows, only = pair_trees.compare(before, after)
    (a,) = rows
    assert a["row"] == "a" and a["median"] == {"before": 11.5, "after": 5.5} and a["verdict"] == "YES"
    assert a["per_round"] == [5.5 / 11] and not a["reference"]
    assert only == ["gone (before only)", "new (after only)"]


def test_convert_seconds_become_throughput():
    d = {"config": {"images": 1, "mixed": 1, "seqs": 1, "npy": 1, "rounds": 2},
         "sections": {"convert": {"bytes": 2e6, "seconds": {"fastdata convert": [1.0, 2.0]}}}}
    rows, _ = pair_trees.parse_raw(d)
    assert rows == {"convert: fastdata convert": ("MB/s", [2.0, 1.0])}
