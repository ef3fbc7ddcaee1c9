"""Every row of docs/reliability.md's "What is checked when" table names tests that fail if that
check is removed. The table is parsed: a new row without an entry here, or an entry naming a test
that does not exist, fails. For the rows in GUARDS the claim itself is tested: the function that makes
the row's check is switched off (replaced with one that lets everything through, by a sitecustomize.py
on PYTHONPATH, so in every Python process the test starts too), and each test the row names is run in a
fresh pytest and must fail."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TABLE_HEADING = "## What is checked when"

# row (its first cell, as written) -> tests ("file::function") that fail without that check
CHECKS: dict[str, list[str]] = {
    "manifest: JSON, version, limits, field rules, shard names, shards inside the folder": [
        "test_dataset.py::test_manifest_that_is_not_json",  # JSON
        "test_dataset.py::test_hostile_manifest_is_rejected",  # version, limits, field dtypes, shard names
        "test_dataset.py::test_shard_symlink_outside_dataset_is_rejected",  # inside the folder
    ],
    "each shard exists and has the manifest's size": [
        "test_dataset.py::test_truncated_or_missing_shard",  # at open
        "test_reliability_read.py::test_shard_missing_after_open",  # when the process opens the shard
    ],
    "the shard's size has not changed since it was opened": [
        "test_reliability_read.py::test_shard_truncated_while_open_raises_instead_of_sigbus",  # read, cut, read
        "test_lmdb_read.py::test_a_shard_truncated_after_its_first_read_is_an_error",
    ],
    "HDF5: every field's dataset, dtype, shape; ragged offsets; data inside the file; the shard's first "
    "sample (`fastdata_start`)": [
        "test_reliability_read.py::test_manifest_schema_that_does_not_match_the_shards",  # [hdf5]: dtype, shape, name
        "test_reliability_read.py::test_swapped_shards_are_refused",  # [hdf5]: fastdata_start
        "test_reliability_read.py::test_hdf5_corrupted_metadata_gives_corrupt_shard_error",
    ],
    "LMDB: its last page lies inside the file; the shard's own record of its first sample, count and schema": [
        "test_reliability_read.py::test_lmdb_page_count_past_the_file_is_refused",
        # not test_swapped_shards_are_refused: a swapped LMDB shard is refused with the shard record's check
        # switched off too (its first record is missing), so it does not show this check
        "test_reliability_read.py::test_manifest_schema_that_does_not_match_the_shards",  # [lmdb]: its schema
    ],
    "LMDB: record present; magic, field count, payload sizes and record length match the schema": [
        "test_reliability_read.py::test_flipped_record_header_names_the_sample_in_every_read_path",  # first read
        "test_dataset.py::test_lmdb_flipped_header_byte",
        "test_lmdb_read.py::test_small_records_are_checked_on_every_read_not_only_the_first",
    ],
    "LMDB: the record's header (magic, field count, payload sizes) is the one that first read found": [
        "test_lmdb_read.py::test_a_record_header_rewritten_in_place_after_the_first_read_raises",
    ],
    "images decode, to exactly their recorded size; a PNG in its recorded mode (a JPEG is converted to it, "
    "[backends.md](backends.md#jpeg-decoders-on-the-cpu-simplejpeg-and-pil))": [
        "test_images_read.py::test_decoders_raise_on_truncated_jpeg",  # both decoders: size, corrupt data
        "test_images_read.py::test_corrupt_stored_image_names_the_sample",
        "test_decode_modes.py::test_a_png_in_another_mode_is_refused",
    ],
    "checksum of every shard": [
        "test_verify.py::test_flipped_byte_is_a_checksum_problem",
    ],
    "labels within the class list; each sample as decoded": [
        "test_verify.py::test_deep_checks_labels_against_the_classes",
        "test_verify.py::test_deep_decodes_images",
    ],
    "each shard's count fits in its bytes (an LMDB sample takes 24 + 8 per field bytes or more, an HDF5 sample its raw bytes over 2^16)": [
        "test_verify.py::test_a_count_the_shard_bytes_cannot_hold_is_refused_before_any_allocation",
    ],
    "each shard is a regular file (a FIFO or device is refused, not read)": [
        "test_verify.py::test_a_fifo_in_place_of_a_shard_is_not_a_regular_file",
    ],
    "each shard opens: its recorded samples, first sample and schema are the manifest's": [
        "test_verify.py::test_a_count_the_shard_does_not_hold_is_a_quick_problem_and_its_samples_are_not_read",
    ],
    "in-place index: each source file's size, time, metadata, and 64 blocks sampled across its content ("
    "up to 4 blocks of each Zarr file)": [
        "test_inplace.py::test_modified_source_is_refused",  # size
        "test_inplace.py::test_touched_source_is_refused",  # time
        "test_inplace.py::test_a_same_layout_replacement_is_refused_at_open",  # sampled blocks
        "test_inplace.py::test_swapped_zarr_chunk_files_are_refused_at_open",  # sampled blocks of a Zarr store
    ],
    "in-place index built with `--checksum`: each 1 MiB block of a source file (of each file of a Zarr store) "
    "against its checksum taken at index time ([in-place.md](in-place.md#when-the-source-changes))": [
        "test_inplace_blocksums.py::test_an_edit_between_the_sampled_blocks_is_refused_when_read",  # every read path
        "test_inplace_blocksums.py::test_the_loader_refuses_an_edited_block",  # threads and worker processes
    ],
}


# row -> the functions that make its check ("module:qualified name"), what they return switched off, and
# the row's tests that go through them (None: all of them)
GUARDS: dict[str, tuple[tuple[str, ...], str, list[str] | None]] = {
    # the version, limits, field rules and shard names; reading the JSON and keeping shards inside the folder
    # are checked elsewhere (read_manifest, shard_path), so their tests do not go through it
    "manifest: JSON, version, limits, field rules, shard names, shards inside the folder": (
        ("fastdata.format.manifest:_validate",), "None", ["test_dataset.py::test_hostile_manifest_is_rejected"]),
    # the shard's first sample; the dataset, dtype and shape checks are inline where each column is opened
    "HDF5: every field's dataset, dtype, shape; ragged offsets; data inside the file; the shard's first "
    "sample (`fastdata_start`)": (
        ("fastdata.format.hdf5:ShardReader._check_start",), "None", ["test_reliability_read.py::test_swapped_shards_are_refused"]),
    "the shard's size has not changed since it was opened": (
        ("fastdata.format.interface:ShardReaderBase._check_unchanged",), "None", None),
    "LMDB: its last page lies inside the file; the shard's own record of its first sample, count and schema": (
        ("fastdata.format.lmdb:ShardReader._check_meta", "fastdata.format.lmdb:ShardReader._check_shard_record"), "None", None),
    "checksum of every shard": (("fastdata.measure.verify:_check_shard",), "None", None),
    "labels within the class list; each sample as decoded": (("fastdata.measure.verify:check_samples",), "(0, [])", None),
    "in-place index built with `--checksum`: each 1 MiB block of a source file (of each file of a Zarr store) "
    "against its checksum taken at index time ([in-place.md](in-place.md#when-the-source-changes))": (
        ("fastdata.format.external:BlockCheck._compare", "fastdata.format.external:BlockCheck.whole"), "None", None),
}

_SWITCH_OFF = """
import importlib

for guard in {guards!r}:
    module, _, qualname = guard.partition(":")
    obj = importlib.import_module(module)
    *path, name = qualname.split(".")
    for part in path:
        obj = getattr(obj, part)
    getattr(obj, name)  # the guard must exist: a rename fails here, not silently
    setattr(obj, name, lambda *args, **kwargs: {off})
"""


def table_rows() -> list[str]:
    """The first cell of every row of the table under TABLE_HEADING."""
    text = (ROOT / "docs" / "reliability.md").read_text(encoding="utf-8")
    section = text.split(TABLE_HEADING, 1)[1].split("\n#", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("|")][2:]  # past the header and its rule
    assert rows, f"no table under {TABLE_HEADING!r}"
    return [re.split(r"\s\|\s", ln.strip("| "), maxsplit=1)[0].strip() for ln in rows]


def test_every_row_of_the_table_has_tests():
    rows = table_rows()
    missing = [r for r in rows if r not in CHECKS]
    assert not missing, f"rows of docs/reliability.md's table with no test listed in {Path(__file__).name}: {missing}"
    stale = [c for c in CHECKS if c not in rows]
    assert not stale, f"entries for rows no longer in the table: {stale}"


@pytest.mark.parametrize("row", list(CHECKS))
def test_each_listed_test_exists(row):
    assert CHECKS[row], row
    for ref in CHECKS[row]:
        file, _, name = ref.partition("::")
        tree = ast.parse((ROOT / "tests" / file).read_text(encoding="utf-8"))
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert name in defined, f"{ref} (for {row!r}) does not exist"


def _run_switched_off(tmp_path: Path, guards: tuple[str, ...], off: str, refs: list[str]) -> tuple[int, str]:
    (tmp_path / "sitecustomize.py").write_text(_SWITCH_OFF.format(guards=guards, off=off))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE",
                        *(f"tests/{ref}" for ref in refs)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return r.returncode, r.stdout + r.stderr


@pytest.mark.slow  # one pytest subprocess per row of the table; .ci/run runs the slow set after the README's command
@pytest.mark.parametrize("row", list(GUARDS))
def test_each_listed_test_fails_with_its_check_switched_off(row, tmp_path):
    guard, off, refs = GUARDS[row]  # guard: the functions switched off
    refs = refs or CHECKS[row]
    code, out = _run_switched_off(tmp_path, guard, off, refs)
    if code < 0:  # killed by a signal (a SIGBUS where the check is gone): which test, one run each
        for ref in refs:
            code, out = _run_switched_off(tmp_path, guard, off, [ref])
            assert code == 1 or code < 0, f"{ref} passes with {guard} switched off\n{out[-3000:]}"
        return
    assert code == 1, out[-3000:]  # 1: tests ran and some failed (not a usage or collection error)
    failed = {ln.split()[1].split("[")[0] for ln in out.splitlines() if ln.startswith(("FAILED ", "ERROR "))}
    for ref in refs:
        assert f"tests/{ref}" in failed, f"{ref} passes with {guard} switched off\n{out[-3000:]}"


def test_every_guard_is_for_a_row_of_the_table_and_its_tests():
    for row, (_, _, refs) in GUARDS.items():
        assert row in CHECKS and set(refs or []) <= set(CHECKS[row]), row


WRITE_HEADING = "## When writing fails"


def test_every_write_failure_names_tests_that_exist():
    """The "When writing fails" table: each failure's last cell names the tests (``file::function``) that check it."""
    text = (ROOT / "docs" / "reliability.md").read_text(encoding="utf-8")
    section = text.split(WRITE_HEADING, 1)[1].split("\n#", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("|")][2:]
    assert rows, f"no table under {WRITE_HEADING!r}"
    for row in rows:
        refs = re.findall(r"`(test_\w+\.py::\w+)`", row.rsplit(" | ", 1)[-1])
        assert refs, f"a row of {WRITE_HEADING!r} names no test: {row[:80]}"
        for ref in refs:
            file, _, name = ref.partition("::")
            tree = ast.parse((ROOT / "tests" / file).read_text(encoding="utf-8"))
            assert name in {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}, f"{ref} does not exist"
