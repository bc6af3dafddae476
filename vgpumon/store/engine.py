"""Engine creation: SQLite (default) or Postgres through one SQLAlchemy URL, with bounded waits,
and read-only opening for the commands that only read.

Readers (``diagnose``, ``db stats``) never create or change a file. On SQLite they open the
database read-only: ``mode=ro`` while its ``-shm`` file exists (an agent has it open, or died
with it open: the write-ahead log may hold the newest rows, and only a WAL-aware connection sees
them), else ``immutable=1``. With no ``-shm`` no connection has the database open, so nothing
can change under the reader; and ``mode=ro`` would have to create ``-wal`` and ``-shm`` first,
which leaves files behind in a writable directory and fails in a read-only one ("attempt to
write a readonly database", SQLITE_READONLY_DIRECTORY, checked with SQLite 3.40). When
``mode=ro`` cannot open it (the ``-shm`` of another user, in a directory we cannot write),
the reader falls back to ``immutable=1`` and says so (``sqlite_access``). On Postgres a reader's
sessions are ``default_transaction_read_only``.
"""

from __future__ import annotations

import math
import os
import socket
import sqlite3
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote, unquote

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
from sqlalchemy.pool import ConnectionPoolEntry

from vgpumon.base.errors import StoreUnavailableError, StoreUnreachableError
from vgpumon.base.files import UnsafePath, check_private_dir, make_private_dirs, open_private
from vgpumon.base.masking import mask_secrets

DEFAULT_BUSY_TIMEOUT_MS = 5000
#: libpq counts ``connect_timeout`` in whole seconds and treats anything under 2 as 2.
MIN_CONNECT_TIMEOUT_S = 2


def unavailable(engine_or_url: Engine | URL | str, exc: BaseException | str) -> StoreUnavailableError:
    """The one-line ``StoreUnavailableError`` of a failed store operation.

    Args:
        engine_or_url: the store (its URL is named with the password masked).
        exc: the driver's exception (its first line is kept) or a message.
    """
    url = engine_or_url.url if isinstance(engine_or_url, Engine) else engine_or_url
    shown = describe_store(url) if isinstance(url, URL) else str(url)
    detail = exc if isinstance(exc, str) else str(getattr(exc, "orig", None) or exc).strip()
    first = (detail.splitlines() or [type(exc).__name__])[0]
    kind = StoreUnreachableError if not isinstance(exc, str) and transient(exc) else StoreUnavailableError
    return kind(mask_secrets(f"store {shown} unavailable: {first}"))


#: SQLSTATE classes of a condition that passes: 08 connection exception, 53 insufficient
#: resources (too many connections, disk full), 57 operator intervention (shutting down, starting
#: up, a statement cancelled by ``statement_timeout``), 40 transaction rollback (serialization,
#: deadlock), 55P03 lock not available.
_TRANSIENT_SQLSTATE = ("08", "53", "57", "40", "55P03")
#: libpq's "FATAL:" refusals at connection that pass (Postgres 12–17 wording).
_TRANSIENT_FATAL = (
    "starting up", "shutting down", "recovery mode", "too many clients", "too many connections", "connection slots",
    "terminating connection",
)
#: libpq's and the server's refusals that no wait cures, whether or not FATAL (Postgres 12–17 wording).
_PERMANENT_LIBPQ = (
    "password", "authentication", "SSL", "invalid ", "does not exist", "permission denied", "no pg_hba.conf entry",
)


def transient(exc: BaseException) -> bool:
    """Whether a store failure is one that passes by itself (the server unreachable, restarting,
    not answering, out of connections; a SQLite file locked by another writer) rather than one
    that needs a person (a wrong password or database name, a read-only or corrupt file, a newer
    schema). Decides between exit 75 and 69 (``StoreUnreachableError``).

    Postgres: a connection-level error with no SQLSTATE (refused, timed out, the connection lost)
    or one of ``_TRANSIENT_SQLSTATE``, unless libpq's message names a setting or a credential
    (``_PERMANENT_LIBPQ``). SQLite: locked, busy, or the disk full. SQLAlchemy's pool timeout.
    """
    from sqlalchemy.exc import DBAPIError
    from sqlalchemy.exc import TimeoutError as PoolTimeoutError

    if isinstance(exc, PoolTimeoutError):
        return True
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    if isinstance(orig, sqlite3.OperationalError):  # locked by another writer; the disk full (as Postgres' class 53)
        return any(p in str(orig) for p in ("locked", "busy", "disk is full"))
    if not type(orig).__module__.startswith("psycopg"):  # no psycopg import for a SQLite store
        return False
    import psycopg

    if not isinstance(orig, (psycopg.OperationalError, psycopg.InterfaceError)):
        return False
    state = str(getattr(orig, "sqlstate", "") or "")
    if state:
        return state.startswith(_TRANSIENT_SQLSTATE)
    # libpq's connection errors carry no SQLSTATE: a server that answered FATAL is reachable, and
    # only its passing refusals are transient (a wrong role, database or password is not); a
    # setting libpq itself refuses (no password given, SSL required but absent, a bad sslmode or
    # port) needs a person as much
    message = str(orig)
    if any(p in message for p in _PERMANENT_LIBPQ):
        return False
    if "FATAL:" not in message:
        return True  # refused, timed out, host not found, the connection lost
    return any(p in message for p in _TRANSIENT_FATAL)


def describe_store(url: URL | Engine) -> str:
    """How messages name a store: a SQLite file by its path, any other by its URL with the
    password masked."""
    url = url.url if isinstance(url, Engine) else url
    file = sqlite_file(url)
    return str(file) if file is not None else mask_secrets(url.render_as_string(hide_password=True))


class ConnectionWatch:
    """The DBAPI connections an engine's pool holds, and when the pool last opened, lent or took
    back one: how the agent tells a silent store from a slow one, and makes a call stuck on a
    silent one fail.

    A Postgres server that accepts a connection and then never answers (a paused VM, a stalled
    proxy or storage, a stopped postmaster) leaves a query waiting for ever: the kernel still
    acknowledges every packet, so neither TCP keepalives nor libpq's ``connect_timeout`` end it,
    and the server's ``statement_timeout`` needs a server that runs. ``cut`` ends such a wait from
    another thread: it shuts down each Postgres connection's socket (the waiting call fails at
    once as a lost connection: psycopg's ``OperationalError``, the pool invalidates the
    connection) and interrupts each SQLite one (``sqlite3.Connection.interrupt``). The caller's
    usual "store unavailable" path then takes over (the agent spools the rows and retries).

    Movement is kept per thread (``moved_at``): one thread stuck on a connection that stopped
    answering (a NAT dropping one flow, one backend stalled) must not look alive because another
    thread's connection still answers.

    Args:
        engine: the engine whose pool is watched (pool events ``connect``, ``checkout``,
            ``checkin``, ``close``, ``close_detached``, ``detach``).
    """

    def __init__(self, engine: Engine) -> None:
        #: thread ident → ``time.monotonic()`` of that thread's last connect, checkout or checkin
        self._moved: dict[int, float] = {}
        self._conns: dict[int, DBAPIConnection] = {}
        event.listen(engine, "connect", self._connected)
        event.listen(engine, "checkout", self._moving)
        event.listen(engine, "checkin", self._moving)
        for gone in ("close", "close_detached", "detach"):
            event.listen(engine, gone, self._closed)

    # the pool events' other arguments (its record, the proxy) are not used: opaque here
    def _connected(self, dbapi_connection: DBAPIConnection, *_: object) -> None:
        self._conns[id(dbapi_connection)] = dbapi_connection
        self._moving()

    def _moving(self, *_: object) -> None:
        self._moved[threading.get_ident()] = time.monotonic()

    def moved_at(self, thread: int | None) -> float:
        """``time.monotonic()`` of thread ``thread``'s last movement in the pool (a connection
        opened, lent or taken back); ``-inf`` when it made none yet or ``thread`` is ``None``."""
        return self._moved.get(thread, float("-inf")) if thread is not None else float("-inf")

    def moved(self, thread: int | None) -> None:
        """Count now as a movement of ``thread`` (after a cut: the next only after another deadline)."""
        if thread is not None:
            self._moved[thread] = time.monotonic()

    def _closed(self, dbapi_connection: DBAPIConnection, *_: object) -> None:
        self._conns.pop(id(dbapi_connection), None)

    def cut(self) -> int:
        """Make every call waiting on one of the pool's connections fail now (see the class);
        returns how many connections were cut. Safe from any thread; never raises."""
        cut = 0
        for conn in list(self._conns.values()):
            try:
                pgconn = getattr(conn, "pgconn", None)
                if pgconn is not None:  # psycopg: shut the socket down under the waiting call
                    with socket.socket(fileno=os.dup(pgconn.socket)) as sock:
                        sock.shutdown(socket.SHUT_RDWR)
                elif isinstance(conn, sqlite3.Connection):
                    conn.interrupt()
                else:
                    continue
                cut += 1
            except Exception:  # noqa: BLE001, S112 - closed meanwhile, or not a socket: nothing waits on it
                continue
        return cut


def _sqlite_pragmas(busy_timeout_ms: int, read_only: bool) -> Callable[[DBAPIConnection, ConnectionPoolEntry], None]:
    def on_connect(dbapi_connection: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
        _apply_pragmas(dbapi_connection, busy_timeout_ms, read_only)

    return on_connect


def _apply_pragmas(dbapi_connection: DBAPIConnection, busy_timeout_ms: int, read_only: bool) -> None:
    cur = dbapi_connection.cursor()
    # A reader's checkpoint or a second writer can hold the lock briefly: wait rather than fail.
    # After this long the agent's write fails and its batch goes to the spool instead.
    cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
    if read_only:
        # Belt and braces over mode=ro / immutable=1: a reader's statement can never write.
        # journal_mode is not set: on an empty file that alone would write a database header.
        cur.execute("PRAGMA query_only=ON")
        cur.close()
        return
    # WAL: readers (diagnose, capacity) never block the agent's writes, and the agent never
    # blocks them (tests/store/test_store.py holds a read transaction open while the agent writes).
    cur.execute("PRAGMA journal_mode=WAL")
    # In WAL mode NORMAL is durable across application crashes and only a power loss can undo
    # the last commits; FULL would fsync on every batch for little gain in a telemetry store.
    cur.execute("PRAGMA synchronous=NORMAL")
    # Identity rows (hosts, gpus) are referenced by every sample: keep the references honest.
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def normalise_url(url: str) -> URL:
    """Parse a store URL; a plain path means a SQLite file.

    Raises:
        StoreUnavailableError: the URL cannot be parsed.
    """
    if "://" not in url:  # a plain file path: the SQLite store people mean when they type one
        return URL.create("sqlite", database=str(Path(url).expanduser().resolve()))
    try:
        return make_url(url)
    except (ArgumentError, ValueError):
        raise StoreUnavailableError(f"not a database URL: {mask_secrets(url)!r} (e.g. sqlite:///vgpumon.db)") from None


def sqlite_file(url: URL) -> Path | None:
    """The database file of a SQLite URL (``sqlite:///x.db`` or the URI form
    ``sqlite:///file:x.db?mode=ro&uri=true``); ``None`` for an in-memory database or another
    engine."""
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    db = url.database
    if db.startswith("file:") and str(url.query.get("uri", "")).lower() in ("true", "1"):
        db = unquote(db[len("file:") :].split("?", 1)[0])
        if db.startswith("//"):  # file://host/path: only an empty or "localhost" host is valid
            db = "/" + db[2:].split("/", 1)[-1]
        if not db or db == ":memory:":
            return None
    return Path(db).expanduser()


def check_reachable(file: Path) -> None:
    """Refuse a SQLite store whose path this user cannot look at: a directory on it that it
    may not search (``/root/x.db`` for a user other than root), or a part of it that is a file,
    not a directory (``/etc/hosts/x.db``). pathlib's ``exists()`` and ``is_file()`` raise
    ``PermissionError`` there; a store that is simply absent passes (the caller says so).

    Raises:
        StoreUnavailableError: the path cannot be reached (exit 69; ``diagnose``: UNKNOWN).
    """
    try:
        os.stat(file)
    except FileNotFoundError:
        return
    except NotADirectoryError:
        parent = next((p for p in file.parents if p.exists() and not p.is_dir()), file.parent)
        raise StoreUnavailableError(f"store {file} unavailable: {parent} is a file, not a directory; see --db") from None
    except PermissionError:
        closed = next((p for p in reversed(file.parents) if not os.access(p, os.X_OK)), file.parent)
        raise StoreUnavailableError(
            f"store {file} unavailable: permission denied: this user (uid {os.geteuid()}) may not enter {closed}; "
            "run the command as the store's owner, or give this user the store's group (docs/security.md)"
        ) from None
    except OSError as exc:  # a name too long, a loop of symbolic links: the path is no store
        raise StoreUnavailableError(f"store {file} unavailable: {exc.strerror or exc}") from None


def sqlite_access(engine: Engine) -> str:
    """How a SQLite engine reads its file: ``"read-write"``, ``"read-only"`` (``mode=ro``) or
    ``"immutable"`` (a snapshot: no locks, no write-ahead log). ``"read-write"`` for Postgres."""
    q = engine.url.query
    if str(q.get("immutable", "")) == "1":
        return "immutable"
    if q.get("mode") == "ro":
        return "read-only"
    return "read-write"


def _sqlite_read_url(path: Path, mode: str) -> URL:
    query = {"uri": "true", **({"immutable": "1"} if mode == "immutable" else {"mode": "ro"})}
    return URL.create("sqlite", database="file:" + quote(str(path.resolve())), query=query)


def make_engine(
    url: str,
    *,
    create_dirs: bool = True,
    read_only: bool = False,
    busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
    connect_timeout_s: float | None = None,
    statement_timeout_s: float | None = None,
) -> Engine:
    """Create an engine for a store URL.

    Args:
        url: SQLAlchemy URL, e.g. ``sqlite:///var/lib/vgpumon/vgpumon.db``,
            ``sqlite:///file:vgpumon.db?mode=ro&uri=true`` or ``postgresql+psycopg://user@host/db``;
            a plain path means a SQLite file.
        create_dirs: create the parent directory of a SQLite file when missing.
        read_only: open for reading only (module docstring): the engine never creates or
            changes a file; SQLite opens ``mode=ro`` or ``immutable=1``, Postgres sessions are
            read-only. The caller checks that a SQLite file exists first.
        busy_timeout_ms: SQLite: how long a write waits for another writer's lock before it
            fails (ms).
        connect_timeout_s: Postgres: give up connecting after this long (whole seconds, at
            least 2, as libpq counts them); ``None`` waits as long as the network does.
        statement_timeout_s: Postgres: the server cancels a statement running longer than this;
            ``None`` keeps the server's setting.

    Raises:
        StoreUnavailableError: the URL is malformed or its driver is not installed.
    """
    parsed = normalise_url(url)
    connect_args: dict[str, str | int] | None = None  # Postgres: the driver's, with a pre-ping pool
    file = sqlite_file(parsed)
    if parsed.get_backend_name() == "sqlite":
        if file is not None:
            check_reachable(file)
        if read_only and file is not None and str(parsed.query.get("immutable", "")) != "1":
            # a URL's own mode=ro too: with no -shm it would create -wal and -shm
            parsed = _sqlite_read_url(file, _sqlite_read_mode(file))
        elif file is not None and not read_only and file.exists() and not file.is_file():
            # /dev/null, a directory, a FIFO: SQLite would create its journal and the migration
            # lock beside it (in /dev as root) before failing with "disk I/O error"
            raise StoreUnavailableError(f"store {file} is not a regular file (a SQLite store is one); see --db")
        elif file is not None and create_dirs and not read_only:
            try:
                make_private_dirs(file.parent)
            except OSError as exc:
                raise StoreUnavailableError(f"cannot create the store's directory {file.parent}: {exc.strerror or exc}") from None
        if file is not None and not read_only:
            _create_private(file)
    else:
        connect_args = {}
        if connect_timeout_s is not None:
            connect_args["connect_timeout"] = max(MIN_CONNECT_TIMEOUT_S, math.ceil(connect_timeout_s))
        options = [str(parsed.query["options"])] if "options" in parsed.query else []
        if statement_timeout_s is not None:
            options.append(f"-c statement_timeout={max(1, int(statement_timeout_s * 1000))}")
        if read_only:
            options.append("-c default_transaction_read_only=on")
        if options:
            connect_args["options"] = " ".join(options)
    try:
        engine = create_engine(parsed) if connect_args is None else create_engine(
            parsed, pool_pre_ping=True, connect_args=connect_args
        )
    except (NoSuchModuleError, ModuleNotFoundError, ImportError) as exc:
        extra = "; install the postgres extra: pip install 'vgpumon[postgres]'" if parsed.get_backend_name() == "postgresql" else ""
        raise StoreUnavailableError(f"no driver for {parsed.drivername}: {exc}{extra}") from None
    except ArgumentError as exc:
        raise StoreUnavailableError(mask_secrets(f"not a usable store URL: {str(exc).splitlines()[0]}")) from None
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas(busy_timeout_ms, read_only))
        if read_only and sqlite_access(engine) == "read-only" and file is not None:
            engine = _immutable_unless_readable(engine, file, busy_timeout_ms)
    return engine


def _create_private(file: Path) -> None:
    """Check where a SQLite store is written, then create it, when new, as an empty file of
    ``PRIVATE_FILE_MODE`` (an empty file is an empty database) before SQLite opens it: SQLite
    would create it 0644 less the umask, 0644 under ``umask 000``, and gives its ``-wal``,
    ``-shm`` and ``-journal`` files the mode of the database file. Where it cannot be created,
    SQLite's own attempt says why.

    The store, its journals and its migration lock must not be another user's symbolic links or
    files, nor lie in a directory another user may write in that is not sticky: SQLite and the
    lock follow links (``/tmp/x.db -> /etc/cron.d/job`` made root create a database there).

    Raises:
        StoreUnavailableError: one of them is not this user's (or root's) own.
    """
    try:
        check_private_dir(file.parent, itself=False)
        for path in (file, *(Path(f"{file}{s}") for s in ("-wal", "-shm", "-journal", ".migrate.lock"))):
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(st.st_mode) and path != file or st.st_uid not in (0, os.geteuid()):
                raise UnsafePath(f"{path} is {'a symbolic link' if stat.S_ISLNK(st.st_mode) else 'a file'} of uid {st.st_uid}")
    except OSError as exc:
        raise StoreUnavailableError(f"store {file} refused: {exc}; see docs/security.md, \"Files\"") from None
    if file.exists():
        return
    try:
        os.close(open_private(file, "x"))
    except OSError:
        pass  # made meanwhile (another agent), or a directory SQLite will name in its own error


def _sqlite_read_mode(file: Path) -> str:
    shm, wal = Path(f"{file}-shm"), Path(f"{file}-wal")
    if shm.exists() or (wal.exists() and wal.stat().st_size > 0):
        return "ro"
    return "immutable"


def _immutable_unless_readable(engine: Engine, file: Path, busy_timeout_ms: int) -> Engine:
    """``mode=ro`` needs to map the ``-shm`` file; where it cannot (another user's files in a
    directory we cannot write), read the file as an immutable snapshot instead."""
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT count(*) FROM sqlite_master").scalar()
        return engine
    except Exception as exc:  # noqa: BLE001 - any failure to open read-only: try the snapshot
        orig = getattr(exc, "orig", exc)
        if not isinstance(orig, sqlite3.OperationalError) or "not a database" in str(orig):
            return engine  # not a matter of access: the caller's first query reports it
        engine.dispose()
    snapshot = create_engine(_sqlite_read_url(file, "immutable"))
    event.listen(snapshot, "connect", _sqlite_pragmas(busy_timeout_ms, True))
    return snapshot
