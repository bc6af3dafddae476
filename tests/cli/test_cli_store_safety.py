"""Commands on-call can trust, against real stores through the real console script: readers need
no write access and change no file, every wait is bounded, no password is printed, a newer
schema or another application's database is refused in one line, agents that start together do
not collide, a GPU's history belongs to its host, and Ctrl-C never prints a traceback."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import DATA, H200_CAPTURE, POSTGRES_ENV, VGPUMON, _reset_postgres, has_vgpumon_handlers, vgpumon, wait_for
from sqlalchemy import text

from vgpumon.store.engine import make_engine
from vgpumon.store.migrate import head_revision, upgrade

pytestmark = pytest.mark.slow  # starts processes or servers: not in the quick subset (docs/testing.md)

#: The console script users run (signal tests use it: `python -m` adds runpy's own frames).
SCRIPT = shutil.which("vgpumon", path=str(Path(sys.executable).parent)) or shutil.which("vgpumon")
IDLE_CAPTURE = DATA / "h200-idle-full.jsonl.gz"


def run(*args: str, env: dict | None = None, timeout: float = 120, prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    return vgpumon(*args, env=env, clean=True, timeout=timeout, prefix=prefix)


def replay(url: str, host: str, capture: Path = H200_CAPTURE) -> None:
    out = run("agent", "--listen", "off", "--replay", str(capture), "--db", url, "--hostname", host)
    assert out.returncode == 0, out.stderr


def _listing(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def _report_line(out: subprocess.CompletedProcess) -> str:
    """diagnose's text report says a store it cannot use once, on its UNKNOWN first line (stderr
    stays empty: the same reason twice was a stray line)."""
    assert "Traceback" not in out.stderr and not out.stderr.strip(), out.stderr
    first = out.stdout.strip().splitlines()[0]
    assert first.startswith("UNKNOWN"), out.stdout
    return first


def _one_line(out: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


# -- reading needs no write access ----------------------------------------------------------------


def _unprivileged() -> list[str]:
    """A command prefix that runs as an unprivileged user, or skips saying why.

    Not root: run as this user (the test makes the store read-only). Root: ``setpriv`` to
    ``nobody``; where the interpreter or this checkout is in a directory only root can read, the
    process keeps CAP_DAC_READ_SEARCH (read any file) and still cannot write anything it does not
    own, which is all this test is about.
    """
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv (util-linux): cannot become an unprivileged user")
    base = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    for extra in ([], ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]):
        probe = subprocess.run(base + extra + [sys.executable, "-c", "import vgpumon.cli"], capture_output=True, text=True)
        if probe.returncode == 0:
            return base + extra
    pytest.skip(f"cannot run this interpreter as uid 65534: {probe.stderr.strip().splitlines()[-1:]}")


def _readable_dir(tmp_path: Path) -> Path:
    """A directory an unprivileged user can reach (pytest's own tmp root is 0700 for root)."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="vgpumon-ro-", dir="/tmp" if os.geteuid() == 0 else tmp_path))
    d.chmod(0o755)
    return d


def test_a_user_without_write_access_reads_a_store_whose_agent_stopped(tmp_path):
    """The post-mortem the README advertises: the agent (root) is stopped, its store is a 0644
    file in a 0755 directory, and another user runs diagnose and db stats. Both answer from the
    data, say that the store was read as an immutable snapshot, and leave no file behind."""
    prefix = _unprivileged()
    d = _readable_dir(tmp_path)
    try:
        store = d / "vgpumon.db"
        replay(str(store), "gpu-host-17")
        for extra in d.glob("vgpumon.db.*"):
            extra.unlink()
        store.chmod(0o644)
        if os.geteuid() != 0:  # as the owner, take our own write access away instead
            store.chmod(0o444)
            d.chmod(0o555)
        before = _listing(d)
        env = {"XDG_CONFIG_HOME": "/nonexistent", "HOME": "/nonexistent"}
        report = run("diagnose", "gpu-host-17", "--db", str(store), "--json", env=env, prefix=prefix)
        assert report.returncode == 0, report.stderr + report.stdout
        doc = json.loads(report.stdout)
        assert doc["gpus"][0]["samples"] > 60
        assert doc["store_note"] == "read as an immutable snapshot (no agent has it open)"
        stats = run("db", "stats", "--db", str(store), "--json", env=env, prefix=prefix)
        assert stats.returncode == 0, stats.stderr
        assert json.loads(stats.stdout)["tables"][0]["rows"] == doc["gpus"][0]["samples"]
        text_report = run("diagnose", "gpu-host-17", "--db", str(store), env=env, prefix=prefix)
        assert "store read as an immutable snapshot" in text_report.stdout
        assert _listing(d) == before, "a reader created or changed a file"
    finally:
        d.chmod(0o755)
        shutil.rmtree(d)


def test_a_reader_sees_rows_still_in_the_write_ahead_log_of_a_running_writer(tmp_path):
    """While a writer holds the store open (its -wal and -shm exist), a reader without write
    access opens it read-only and sees rows not yet checkpointed into the main file."""
    prefix = _unprivileged()
    d = _readable_dir(tmp_path)
    writer = None
    try:
        store = d / "vgpumon.db"
        replay(str(store), "gpu-host-17")
        writer = sqlite3.connect(store)
        writer.execute("PRAGMA wal_autocheckpoint=0")
        writer.execute("INSERT INTO hosts (hostname, first_seen) VALUES ('only-in-the-log', '2026-11-30 00:00:00')")
        writer.commit()
        for p in d.iterdir():
            p.chmod(0o644)
        before = _listing(d)
        out = run("diagnose", "nope", "--db", str(store), "--json", env={"XDG_CONFIG_HOME": "/nonexistent"}, prefix=prefix)
        assert out.returncode == 3
        doc = json.loads(out.stdout)
        assert "only-in-the-log" in doc["findings"][0]["message"]
        assert "store_note" not in doc  # plain read-only access: nothing to say
        assert _listing(d) == before
    finally:
        if writer is not None:
            writer.close()
        shutil.rmtree(d)


def test_a_sqlite_uri_url_is_accepted(tmp_path):
    store = tmp_path / "vgpumon.db"
    replay(str(store), "gpu-host-17")
    out = run("diagnose", "gpu-host-17", "--db", f"sqlite:///file:{store}?mode=ro&uri=true")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("OK gpu-host-17")


def test_a_zero_byte_file_stays_zero_bytes(tmp_path):
    """A reader given an empty file says it holds no data; it used to become a 4 KB database."""
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    out = run("diagnose", "h", "--db", str(empty))
    assert out.returncode == 3 and "holds no vgpumon data" in out.stdout.splitlines()[0] and out.stderr == ""
    assert run("db", "stats", "--db", str(empty)).returncode == 69
    assert [p.name for p in tmp_path.iterdir()] == ["empty.db"] and empty.stat().st_size == 0


def test_the_agent_leaves_another_applications_sqlite_file_untouched(tmp_path):
    foreign = tmp_path / "app.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    conn.commit()
    conn.close()
    before = _listing(tmp_path)
    out = run("agent", "--listen", "off", "--replay", str(H200_CAPTURE), "--db", str(foreign))
    assert out.returncode == 69
    assert "holds tables of something else (invoices)" in _one_line(out)
    assert _listing(tmp_path) == before, "not even switched to WAL, no lock file beside it"


def test_the_agent_on_a_store_it_cannot_write_exits_69_in_one_line(tmp_path):
    """A store failure after start is 69 (the agent used to exit 3, a diagnose status)."""
    store = tmp_path / "vgpumon.db"
    replay(str(store), "gpu-host-17")
    out = run("agent", "--listen", "off", "--replay", str(H200_CAPTURE), "--db", f"sqlite:///file:{store}?mode=ro&uri=true")
    assert out.returncode == 69
    assert "readonly database" in _one_line(out)


# -- bounded time -----------------------------------------------------------------------------------


@pytest.fixture
def silent_postgres():
    """A TCP listener that accepts connections and never says a word (a hung database)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                accepted.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=serve, daemon=True).start()
    yield f"postgresql+psycopg://monitor:hunter2@127.0.0.1:{server.getsockname()[1]}/fleet"
    server.close()
    for c in accepted:
        c.close()


def test_a_database_that_never_answers_is_unknown_within_10_s(silent_postgres):
    """The store's connect timeout (5 s) ends the wait, and says so; it used to hang 130 s. The
    elapsed-time bounds only tell that hang from the timeout on a loaded machine: the line
    naming the timeout is what shows the bound was the one that acted."""
    start = time.monotonic()
    out = run("diagnose", "gpu-host-17", "--db", silent_postgres, "--max-age", "2m")
    assert time.monotonic() - start < 60.0
    assert out.returncode == 3
    assert "connection timeout expired" in _report_line(out)
    assert "hunter2" not in out.stdout + out.stderr
    start = time.monotonic()
    stats = run("db", "stats", "--db", silent_postgres, env={"VGPUMON_STORE__CONNECT_TIMEOUT": "2s"})
    assert stats.returncode == 75 and "connection timeout expired" in _one_line(stats)
    assert time.monotonic() - start < 60.0


def test_diagnose_timeout_is_configurable(silent_postgres, tmp_path):
    """diagnose.timeout bounds the whole command, below the store's connect timeout too."""
    cfg = tmp_path / "config.toml"
    cfg.write_text('[diagnose]\ntimeout = "1s"\n[store]\nconnect_timeout = "30s"\n')
    start = time.monotonic()
    out = run("--config", str(cfg), "diagnose", "h", "--db", silent_postgres)
    # its own words, and well before the 30-s connect timeout it has to beat
    assert out.returncode == 3 and time.monotonic() - start < 25.0
    assert "did not answer within 1s" in _report_line(out)


# -- no secrets in output -----------------------------------------------------------------------------


def test_passwords_never_reach_the_screen(tmp_path, silent_postgres):
    url = "postgresql+psycopg://monitor:hunter2@127.0.0.1:1/fleet"
    env = {"VGPUMON_DB": url}
    help_out = run("diagnose", "--help", env=env)
    shown = run("config", "show", env=env)
    shown_json = run("config", "show", "--json", env=env)
    failed = run("--log-level", "debug", "db", "stats", env=env)
    for out in (help_out, shown, shown_json, failed):
        assert "hunter2" not in out.stdout + out.stderr
    assert 'url = "postgresql+psycopg://monitor:***@127.0.0.1:1/fleet"  # from VGPUMON_DB' in shown.stdout
    assert json.loads(shown_json.stdout)["settings"]["store"]["url"]["value"] == "postgresql+psycopg://monitor:***@127.0.0.1:1/fleet"
    assert failed.returncode == 75 and "monitor:***@" in failed.stderr


@pytest.mark.skipif(not os.environ.get(POSTGRES_ENV), reason=f"needs Postgres ({POSTGRES_ENV})")
def test_the_agents_closing_line_masks_the_password():
    from sqlalchemy.engine import make_url

    url = make_url(os.environ[POSTGRES_ENV])
    _reset_postgres(str(url))
    with_password = url.set(password="hunter2").render_as_string(hide_password=False)  # trust auth ignores it
    out = run("--log-level", "info", "agent", "--listen", "off", "--replay", str(H200_CAPTURE), "--db", with_password)
    assert out.returncode == 0, out.stderr.replace("hunter2", "<leaked>")
    assert "hunter2" not in out.stderr + out.stdout
    assert ":***@" in out.stderr.splitlines()[-1] and "rows stored in" in out.stderr


# -- schema newer than the code ------------------------------------------------------------------------


def test_a_store_migrated_by_a_newer_vgpumon_is_refused_by_writers_and_read_by_readers(db_url):
    replay(db_url, "gpu-host-17")
    engine = make_engine(db_url)
    with engine.begin() as conn:  # what a newer vgpumon leaves behind: a revision we do not know
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    for args in (["agent", "--listen", "off", "--replay", str(H200_CAPTURE)], ["db", "upgrade"]):
        out = run(*args, "--db", db_url)
        assert out.returncode == 69, out.stderr
        line = _one_line(out)
        assert "revision 9999" in line and f"its newest is {head_revision()}" in line
    assert run("diagnose", "gpu-host-17", "--db", db_url).returncode == 0
    assert run("db", "stats", "--db", db_url).returncode == 0


# -- agents that start together --------------------------------------------------------------------------


def _start_together(argvs: list[list[str]]) -> list[subprocess.CompletedProcess]:
    procs = [subprocess.Popen(VGPUMON + a, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for a in argvs]
    return [subprocess.CompletedProcess(p.args, p.wait(120), *p.communicate()) for p in procs]


def test_agents_starting_together_on_a_new_sqlite_file_all_migrate_and_store(tmp_path):
    """Two agents on a new file raced in the migration ("table hosts already exists") in most
    runs; three rounds of three agents must all succeed."""
    for round_ in range(3):
        url = f"sqlite:///{tmp_path / f'new-{round_}.db'}"
        outs = _start_together([["agent", "--listen", "off", "--replay", str(H200_CAPTURE), "--db", url, "--hostname", f"h{i}"] for i in range(3)])
        for out in outs:
            assert out.returncode == 0, out.stderr
        hosts = run("diagnose", "nope", "--db", url, "--json")
        assert "hosts in the store: h0, h1, h2" in json.loads(hosts.stdout)["findings"][0]["message"]


@pytest.mark.skipif(not os.environ.get(POSTGRES_ENV), reason=f"needs Postgres ({POSTGRES_ENV})")
def test_agents_registering_one_host_name_at_once_on_postgres_all_succeed():
    url = os.environ[POSTGRES_ENV]
    for _ in range(2):
        _reset_postgres(url)
        outs = _start_together([["agent", "--listen", "off", "--replay", str(H200_CAPTURE), "--db", url, "--hostname", "same"] for _ in range(3)])
        for out in outs:
            assert out.returncode == 0, out.stderr
        engine = make_engine(url)
        with engine.connect() as conn:
            assert conn.scalar(text("SELECT count(*) FROM hosts")) == 1
            assert conn.scalar(text("SELECT count(*) FROM gpus")) == 1
            assert conn.scalar(text("SELECT count(*) FROM gpu_samples")) == 76  # the same ticks, stored once
        engine.dispose()


# -- GPU identity is per host ------------------------------------------------------------------------------


def test_a_gpu_uuid_seen_on_two_hosts_keeps_two_histories(db_url):
    """The masked captures share one UUID: a workload on host a, an idle GPU on host b. Each
    host's report shows its own GPU's history, not the other's."""
    replay(db_url, "a", H200_CAPTURE)
    replay(db_url, "b", IDLE_CAPTURE)
    a = json.loads(run("diagnose", "a", "--db", db_url, "--json").stdout)
    b = json.loads(run("diagnose", "b", "--db", db_url, "--json").stdout)
    assert a["status"] != "unknown" and b["status"] != "unknown", (a["findings"], b["findings"])
    assert a["gpus"][0]["uuid"] == b["gpus"][0]["uuid"]
    assert a["gpus"][0]["samples"] == 76 and b["gpus"][0]["samples"] == 21
    assert a["gpus"][0]["sm_active"]["max_ratio"] > 0.9  # the matmul phase
    assert b["gpus"][0]["sm_active"]["max_ratio"] < 0.05  # idle


def test_gpus_per_host_revision_keeps_existing_gpus_and_their_rows(db_url):
    """A store at the revision before (GPUs unique by UUID) upgrades with its rows intact, and
    then takes the same UUID on a second host."""
    engine = make_engine(db_url)
    upgrade(engine, "0003")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO hosts (id, hostname, first_seen) VALUES (1, 'a', '2026-11-30 00:00:00+00'), (2, 'b', '2026-11-30 00:00:00+00')"))
        conn.execute(text(
            "INSERT INTO gpus (id, uuid, host_id, \"index\", gpm_supported, first_seen, last_seen) "
            "VALUES (1, 'GPU-1', 1, 0, true, '2026-11-30 00:00:00+00', '2026-11-30 00:00:00+00')"
        ))
    assert upgrade(engine) == ("0003", head_revision())
    with engine.begin() as conn:
        assert conn.execute(text("SELECT id, host_id, uuid FROM gpus")).all() == [(1, 1, "GPU-1")]
        conn.execute(text(
            "INSERT INTO gpus (id, uuid, host_id, \"index\", gpm_supported, first_seen, last_seen) "
            "VALUES (2, 'GPU-1', 2, 0, true, '2026-11-30 00:00:00+00', '2026-11-30 00:00:00+00')"
        ))
    engine.dispose()


# -- Ctrl-C -----------------------------------------------------------------------------------------------


@pytest.mark.skipif(SCRIPT is None, reason="the vgpumon console script is not installed (pip install -e .)")
@pytest.mark.parametrize("after", [0.0, 0.2, 0.5, 1.5])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_agent_stops_cleanly_on_a_signal_at_any_moment(tmp_path, sig, after):
    """Start-up included (imports, settings, migrations): exit 0, never a traceback. ``after``
    counts from the moment vgpumon's handlers are in place (a signal before it lands in the
    interpreter's start-up, as for any Python program); the CLI's imports take the next few
    hundred milliseconds, the agent's start-up the rest."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPUMON_")}
    proc = subprocess.Popen(
        [SCRIPT, "agent", "--listen", "off", "--replay", str(H200_CAPTURE), "--pace", "recorded", "--db", str(tmp_path / "x.db")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    wait_for(lambda: has_vgpumon_handlers(proc.pid), what="vgpumon's signal handlers")
    time.sleep(after)  # the moment of the stop, not a wait for something
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    # it says what it did: its summary, or that it stopped before a tick
    assert "vgpumon agent: " in err and ("ticks of" in err or "stopped while starting, before the first tick" in err), err


def test_a_stop_a_library_swallowed_before_the_exec_still_stops_the_agent():
    """CI met it once: a SIGTERM 0.1 s after start landed where a library ate its
    ``KeyboardInterrupt``; the noted stop died with the exec and the replay ran on for minutes.
    The exec honours the note instead: exit 0, one line, no agent started."""
    code = (
        "from vgpumon.base import signals\n"
        "signals._stop_asked = True\n"
        "from vgpumon.agent import process\n"
        "process.exec_agent({'version': process.PLAN_VERSION}, ['agent'])\n"
        "print('exec returned')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "stopped while starting, before the first tick" in proc.stderr
    assert "exec returned" not in proc.stdout and "Traceback" not in proc.stderr


@pytest.mark.skipif(SCRIPT is None, reason="the vgpumon console script is not installed (pip install -e .)")
def test_other_commands_exit_130_on_ctrl_c(silent_postgres):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPUMON_")}
    for after in (0.0, 1.5):  # in the CLI's imports; waiting for the silent database
        proc = subprocess.Popen([SCRIPT, "diagnose", "h", "--db", silent_postgres], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
        wait_for(lambda: has_vgpumon_handlers(proc.pid), what="vgpumon's signal handlers")  # noqa: B023
        time.sleep(after)  # the moment of the Ctrl-C, not a wait for something
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130 and "Traceback" not in err


@pytest.mark.parametrize(("argv", "code"), [(["agent"], 0), (["record", "x"], 0), (["diagnose", "h"], 130)])
def test_a_ctrl_c_wrapped_by_an_import_is_still_a_ctrl_c(monkeypatch, argv, code):
    """Python 3.11 turns a Ctrl-C that lands inside ``__set_name__`` (typer importing pydantic
    while it parses the command line) into ``RuntimeError`` caused by the interrupt; CI met it
    once as exit 70 with a traceback. It is the user's stop: 0 for the agent, 130 elsewhere."""
    import vgpumon.cli.root as cli  # main() calls the app of its own module

    def interrupted_inside_an_import(**_kwargs):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise RuntimeError("Error calling __set_name__ on 'Field' instance 'validators'") from exc

    def broken(**_kwargs):
        raise RuntimeError("a real bug")

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        monkeypatch.setattr(cli, "app", interrupted_inside_an_import)
        with pytest.raises(SystemExit) as stop:
            cli.main(argv)
        assert stop.value.code == code
        monkeypatch.setattr(cli, "app", broken)  # an unrelated RuntimeError stays an internal error
        with pytest.raises(SystemExit) as stop:
            cli.main(argv)
        assert stop.value.code == 70
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
