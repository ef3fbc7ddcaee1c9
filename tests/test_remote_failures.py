"""Object-storage failures that no retry can fix fail at once with one line naming the cause and the
fix (no bucket, no credentials, wrong credentials, an invalid endpoint URL); an unreachable endpoint
is retried visibly (a warning saying what is retried and until when) and gives up at the time bound,
which the CLI sets with --remote-timeout. Against moto's S3 server on 127.0.0.1 (tests/conftest.py)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

from conftest import CREDS, S3Server, bucket, free_port, opts  # noqa: E402

import fastdata  # noqa: E402
from fastdata.errors import NoSuchBucketError, RemoteError, UsageError  # noqa: E402
from fastdata.remote import with_retries  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SLACK = 30.0  # a generous allowance over a time bound (a loaded machine), still far below the default 300 s


def _array(tmp_path: Path) -> Path:
    np.save(tmp_path / "X.npy", np.arange(40, dtype=np.float32).reshape(10, 4))
    return tmp_path / "X.npy"


def _retry_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "fastdata.remote" and r.levelno >= logging.WARNING]


def test_a_missing_bucket_fails_at_once_saying_to_create_it(s3, tmp_path, caplog):
    url = f"s3://no-such-bucket-{os.getpid()}/ds"
    ro = opts(s3, tmp_path / "cache")
    with pytest.raises(NoSuchBucketError, match=rf"no such bucket: create s3://no-such-bucket-{os.getpid()} first"):
        fastdata.convert(None, url, fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1), remote=ro), arrays={"x": _array(tmp_path)})
    with pytest.raises(NoSuchBucketError, match="no such bucket") as e:
        fastdata.open(url, remote=ro)
    assert "--resume" not in str(e.value)
    assert not _retry_warnings(caplog)  # never retried
    uploads = tmp_path / "cache" / "uploads"
    assert not uploads.exists() or not any(uploads.rglob("*.h5"))  # refused before anything was written


def test_cli_convert_into_a_missing_bucket_is_one_line_without_resume_advice(s3, tmp_path, monkeypatch, run_cli):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    monkeypatch.setenv("FASTDATA_REMOTE_CACHE", str(tmp_path / "cache"))
    code, out, err = run_cli("convert", "--data", _array(tmp_path), "s3://no-such-bucket-cli/ds", "--quiet")
    lines = [ln for ln in err.splitlines() if ln.startswith("fastdata: error:")]
    assert code == 1 and len(lines) == 1, err
    assert "no such bucket: create s3://no-such-bucket-cli first" in lines[0] and "--resume" not in err
    for args in (["merge-parts", "s3://no-such-bucket-cli/ds"], ["info", "s3://no-such-bucket-cli/ds"],
                 ["convert", "--data", tmp_path / "X.npy", "s3://no-such-bucket-cli/ds", "--part", "0/2", "--quiet"]):
        code, out, err = run_cli(*args)
        assert code == 1 and "no such bucket: create s3://no-such-bucket-cli first" in err, (args, err)


def test_missing_credentials_fail_at_once(s3, tmp_path, monkeypatch, caplog):
    url = f"s3://{bucket(s3)}/ds"  # the bucket exists: only the credentials are missing
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    ro = fastdata.RemoteOptions(cache_dir=tmp_path / "cache", timeout=60.0,  # a retry would show as a warning
                                storage_options={"client_kwargs": {"endpoint_url": s3.endpoint},
                                                 "skip_instance_cache": True})  # not a client with credentials
    with pytest.raises(RemoteError, match="no credentials .*set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
        fastdata.open(url, remote=ro)
    assert not _retry_warnings(caplog)


@pytest.fixture
def s3_checking_credentials(monkeypatch):
    """A second moto server that authenticates every request: the test credentials are unknown to it."""
    monkeypatch.setenv("INITIAL_NO_AUTH_ACTION_COUNT", "0")
    for k, v in CREDS.items():
        monkeypatch.setenv(k, v)
    server = S3Server(free_port())
    server.start()
    yield server
    server.kill()


def test_wrong_credentials_fail_at_once(s3_checking_credentials, tmp_path, caplog, monkeypatch, run_cli):
    server = s3_checking_credentials
    ro = fastdata.RemoteOptions(cache_dir=tmp_path / "cache", timeout=60.0,
                                storage_options={"client_kwargs": {"endpoint_url": server.endpoint}})
    with pytest.raises(RemoteError, match=r"s3://any/ds.*access denied \(.*\): check the credentials"):
        fastdata.open("s3://any/ds", remote=ro)
    with pytest.raises(RemoteError, match="access denied"):
        fastdata.convert(None, "s3://any/ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1), remote=ro), arrays={"x": _array(tmp_path)})
    assert not _retry_warnings(caplog)


def test_an_invalid_endpoint_url_fails_at_once(tmp_path, caplog):
    ro = fastdata.RemoteOptions(cache_dir=tmp_path / "cache", timeout=60.0,
                                storage_options={"client_kwargs": {"endpoint_url": "not a url"}})
    with pytest.raises(RemoteError, match="Invalid endpoint: not a url: check AWS_ENDPOINT_URL"):
        fastdata.open("s3://any/ds", remote=ro)
    assert not _retry_warnings(caplog)


def test_an_unreachable_endpoint_is_retried_visibly_until_the_bound(tmp_path, caplog):
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    ro = fastdata.RemoteOptions(cache_dir=tmp_path / "cache", timeout=6.0,  # an attempt takes about 1 s here
                                storage_options={"client_kwargs": {"endpoint_url": closed}})
    t0 = time.monotonic()
    with pytest.raises(RemoteError, match=r"s3://any/ds/manifest.json: cannot reach the endpoint .*gave up after "
                                          r"\d+ attempt\(s\) in \d+ s \(the time bound: --remote-timeout"):
        fastdata.open("s3://any/ds", remote=ro)
    assert time.monotonic() - t0 < 6.0 + SLACK
    warnings = _retry_warnings(caplog)
    assert warnings and "s3://any/ds/manifest.json: cannot reach the endpoint" in warnings[0]
    assert "retrying until" in warnings[0]


def test_cli_remote_timeout_bounds_the_retries_and_the_warning_shows_by_default(tmp_path):
    """A real `fastdata info` process: the retry warning is on stderr without --debug, then one error line."""
    env = {**os.environ, **CREDS, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
           "FASTDATA_REMOTE_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    env.pop("FASTDATA_REMOTE_TIMEOUT", None)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "fastdata", "info", "s3://any/ds", "--remote-timeout", "6"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert time.monotonic() - t0 < 6.0 + SLACK + 20  # (+ the interpreter's start)
    assert r.returncode == 1
    assert "WARNING fastdata.remote: s3://any/ds/manifest.json: cannot reach the endpoint" in r.stderr
    assert "retrying until" in r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("fastdata: error:")]
    assert len(errors) == 1 and "gave up after" in errors[0] and "Traceback" not in r.stderr


def test_retrying_warns_at_the_start_then_periodically(monkeypatch, caplog):
    monkeypatch.setattr(fastdata.remote, "WARN_EVERY_S", 0.3)
    calls = []

    def refused() -> None:
        calls.append(time.monotonic())
        raise ConnectionRefusedError("connection refused")

    with pytest.raises(RemoteError, match="gave up after"):
        with_retries(refused, "s3://b/x", time.monotonic() + 1.5, first_delay=0.05, max_delay=0.1)
    warnings = _retry_warnings(caplog)
    assert len(calls) > len(warnings) >= 2  # not every attempt, but more than once
    assert "retrying until" in warnings[0] and "still retrying after" in warnings[1]


@pytest.mark.parametrize("value,ok", [("7", True), ("0.5", True), ("soon", False), ("0", False), ("-3", False)])
def test_the_default_time_bound_comes_from_the_environment(monkeypatch, value, ok):
    monkeypatch.setenv("FASTDATA_REMOTE_TIMEOUT", value)
    if ok:
        assert fastdata.RemoteOptions().timeout == float(value)
    else:
        with pytest.raises(UsageError, match="FASTDATA_REMOTE_TIMEOUT|positive number of seconds"):
            fastdata.RemoteOptions()
    monkeypatch.delenv("FASTDATA_REMOTE_TIMEOUT")
    assert fastdata.RemoteOptions().timeout == 300.0


@pytest.mark.parametrize("value,limit", [("1KB", 1000), (" ", 50 * 10**9), ("", 50 * 10**9), ("soon", None), ("0", None)])
def test_the_default_cache_limit_comes_from_the_environment_and_its_errors_name_it(monkeypatch, value, limit):
    """A bad $FASTDATA_CACHE_LIMIT is an error naming the variable (it said 'cache_limit', which the user never
    set); set but empty is unset, as for $FASTDATA_REMOTE_CACHE and $FASTDATA_REMOTE_TIMEOUT."""
    monkeypatch.setenv("FASTDATA_CACHE_LIMIT", value)
    if limit is not None:
        assert fastdata.RemoteOptions().limit_bytes() == limit
    else:
        with pytest.raises(UsageError, match=rf"^\$FASTDATA_CACHE_LIMIT: .*'{value}'"):
            fastdata.RemoteOptions()
    assert fastdata.RemoteOptions(cache_limit="2KB").limit_bytes() == 2000  # the argument wins


@pytest.mark.parametrize("cache_dir", ["", "  "])
def test_an_empty_cache_dir_is_refused_not_the_working_folder(cache_dir):
    """Path('') is the working folder: shards would land wherever the program runs."""
    with pytest.raises(UsageError, match="cache_dir is empty"):
        fastdata.RemoteOptions(cache_dir=cache_dir)


@pytest.fixture
def s3_to_kill(monkeypatch):
    """A moto server of the test's own, to kill mid-read or mid-write (the test credentials set)."""
    for k, v in CREDS.items():
        monkeypatch.setenv(k, v)
    server = S3Server(free_port())
    server.start()
    yield server
    server.kill()


def test_a_server_gone_mid_read_fails_once_at_the_bound_naming_the_endpoint(s3_to_kill, tmp_path, monkeypatch):
    """Two threads of one process want the same shard (a reader and a prefetch): the second waits on the
    first's download lock, and when the first gives up it gets the first's cause, within the same time
    bound, instead of a lock blamed on its own pid or a second round of retries."""
    import threading

    from fastdata.remote import store as store_module
    from fastdata.remote.store import RemoteStore

    rounds = []  # the downloads' rounds of retries

    def counted(fn, what, deadline, **kw):
        rounds.append(what)
        return with_retries(fn, what, deadline, **kw)

    monkeypatch.setattr(store_module, "with_retries", counted)
    server = s3_to_kill
    server.fs().mkdir("gone")
    url = "s3://gone/ds"
    fastdata.convert(None, url, fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1),
                                                       remote=opts(server, tmp_path / "wcache")),
                     arrays={"x": _array(tmp_path)})
    store = RemoteStore(url, opts(server, tmp_path / "cache", timeout=2.0))
    server.kill()
    errors: dict[str, BaseException] = {}

    def fetch(who: str) -> None:
        try:
            store.fetch(0)
        except BaseException as e:  # noqa: BLE001 - collected for the asserts
            errors[who] = e

    first = threading.Thread(target=fetch, args=("first",))
    first.start()
    time.sleep(1.2)  # well inside the first's 2 s round: the second waits for it, with 1.2 s to spare after
    fetch("second")
    first.join()
    for who in ("first", "second"):
        assert isinstance(errors[who], RemoteError), (who, errors[who])
        assert "shard-00000.h5: download: cannot reach the endpoint" in str(errors[who]), str(errors[who])
        assert "locked by" not in str(errors[who])
    assert [w for w in rounds if w.endswith("download")] == ["s3://gone/ds/shard-00000.h5: download"]  # one round of retries, not a second one after it


def test_a_server_gone_mid_write_stops_the_uploads_at_the_bound_and_removes_what_was_staged(s3_to_kill, tmp_path,
                                                                                          monkeypatch):
    """No shard task starts after an upload gives up (each would wait out the bound again), and the
    staged shards go: --resume starts from the remote journal, never from them."""
    from fastdata.write import shard_task

    server = s3_to_kill
    server.fs().mkdir("gone")
    rounds = []  # the uploads' rounds of retries

    def counted(fn, what, deadline, **kw):
        rounds.append(what)
        if what.endswith("shard-00002.h5: upload"):
            server.kill()  # the server goes as the third shard's upload starts (a poll for its staged file
            # could miss it: a shard is staged for only milliseconds)
        return with_retries(fn, what, deadline, **kw)

    monkeypatch.setattr(shard_task, "with_retries", counted)  # every upload of a conversion goes through it
    np.save(tmp_path / "X.npy", np.random.default_rng(0).random((2000, 2500), dtype=np.float32))  # 20 MB
    uploads = tmp_path / "cache" / "uploads"
    config = fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1, shard_size=1_000_000),
                                    remote=opts(server, tmp_path / "cache", timeout=2.0))
    with pytest.raises(RemoteError, match="cannot reach the endpoint"):
        fastdata.convert(None, "s3://gone/ds", config, arrays={"x": tmp_path / "X.npy"})
    shards = [w for w in rounds if w.endswith(".h5: upload")]
    assert len(shards) <= 3, shards  # not all 20: no task started after the failure
    assert not list(uploads.rglob("*.h5*")), list(uploads.rglob("*"))


def test_an_abandoned_task_of_a_failed_upload_is_no_traceback(caplog):
    """s3fs's multipart upload leaves tasks whose errors nobody retrieves once the call gave up: asyncio
    would print each as a traceback above fastdata's one-line error."""
    from fastdata.remote import filesystem

    fs = filesystem("s3://any/ds", {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}}, 2.0)
    fs.loop.call_soon_threadsafe(fs.loop.call_exception_handler, {
        "message": "Task exception was never retrieved", "exception": ConnectionResetError("gone")})
    time.sleep(0.2)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_shard_uploads_use_the_conversion_time_bound_per_attempt():
    """A worker's upload filesystem caps S3's connect and read timeouts at the conversion's ``timeout``, as the
    driver's does: one attempt cannot outlast the bound."""
    from fastdata.remote import RemoteOptions
    from fastdata.write.shard_task import UrlSpec

    spec = UrlSpec("s3://bucket/ds", RemoteOptions(timeout=3, storage_options={"anon": True}))
    config = spec.filesystem().config_kwargs
    assert config["connect_timeout"] == 3 and config["read_timeout"] == 3
