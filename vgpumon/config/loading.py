"""Loading the settings: ``load_settings`` reads the config file (``--config``,
``$VGPUMON_CONFIG`` or the default one), builds ``Settings`` over it with the flags and the
environment, fills the machine's defaults, and turns the first invalid value into one line that
names where it came from (``--window``, ``VGPUMON_STORE__URL``, ``config.toml: [diagnose] window``)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Collection

from pydantic import ValidationError
from pydantic_settings import SettingsError as _PydanticSettingsError

from vgpumon.base.durations import format_duration
from vgpumon.base.errors import ConfigFileError, UsageError
from vgpumon.base.files import FileRefused, read_small_file
from vgpumon.base.masking import mask_secrets
from vgpumon.config.defaults import default_config_file, default_db_url, default_hostname, default_spool_dir
from vgpumon.config.sections import RULE_NAMES
from vgpumon.config.settings import ENV_ALIASES, ENV_PREFIX, FILE_DATA, Settings, leaves

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: The config file to read when ``--config`` is not given.
CONFIG_ENV = "VGPUMON_CONFIG"

#: A flag given on the command line: setting path → (option name, value).
Flags = dict[tuple[str, ...], tuple[str, Any]]


#: The error line about a setting quotes its value up to this many characters in all.
_MESSAGE_LENGTH = 300

def _has(data: Any, path: tuple[Any, ...]) -> bool:
    return _get(data, path) is not None  # TOML has no null: a key present has a value


def _get(data: Any, path: tuple[Any, ...]) -> Any:
    """The value at ``path`` in nested dicts (``None`` where it is not)."""
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def _nested_env_name(path: tuple[str, ...]) -> str:
    return ENV_PREFIX + "__".join(p.upper() for p in path)


def _origin(path: tuple[Any, ...], flags: Flags, file: Path | None, file_data: dict[str, Any]) -> tuple[str, bool]:
    """Where the value at ``path`` came from, and whether that is the config file."""
    keys = tuple(str(p) for p in path if isinstance(p, str))
    for n in range(len(keys), 0, -1):
        if keys[:n] in flags:
            return flags[keys[:n]][0], False
    for n in range(len(keys), 0, -1):
        name = _nested_env_name(keys[:n])
        if any(k.upper() == name for k, v in os.environ.items() if v):
            return name, False
    for var, target in ENV_ALIASES.items():
        if keys[: len(target)] == target and os.environ.get(var):
            return var, False
    if file is not None and keys and _has(file_data, keys[:2]):
        if len(keys) >= 2 and isinstance(_get(file_data, keys[:2]), dict):  # a table: [rules.thresholds]
            where = f"[{keys[0]}.{keys[1]}]"
        else:
            where = f"[{keys[0]}] {keys[1]}" if len(keys) >= 2 else keys[0]
        return f"{file}: {where}", True
    return ".".join(keys) or "settings", False


def _exists(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a home directory we may not search (another user's, via sudo -u): absent
        return False


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(read_small_file(path).decode("utf-8"))
    except FileRefused as exc:
        raise ConfigFileError(f"cannot read config file: {exc}") from None
    except OSError as exc:
        raise ConfigFileError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"config file {path} is not TOML: {exc}") from None


def load_settings(config_file: Path | None = None, flags: Flags | None = None, *,
                  rule_names: Callable[[], Collection[str]] | None = None) -> Settings:
    """Read the settings: ``flags`` over the environment over the config file over defaults, then
    fill the defaults that depend on the machine (store URL, host name, spool directory).

    Args:
        config_file: ``--config``; ``None`` reads ``$VGPUMON_CONFIG``, else ``default_config_file()``
            when it exists.
        flags: command-line flags that were given (``None`` values are left out by the caller).
        rule_names: the rule names that ``[rules.thresholds]``'s ``for`` and ``disabled`` may use
            (``vgpumon.rules.rule_names``, which imports the rules' catalogue when called, and is
            called only when the table names a rule); ``None``: every rule name is unknown.

    Returns:
        The validated settings; ``origins`` says where each value came from.

    Raises:
        UsageError: a flag or an environment variable has an invalid value (one line naming it).
        ConfigFileError: the config file is missing (when named), unreadable, not TOML, or holds
            an unknown key or an invalid value (the line names the file and the key).
    """
    flags = {k: v for k, v in (flags or {}).items() if v[1] is not None}
    path: Path | None = config_file
    if path is None and os.environ.get(CONFIG_ENV):
        path = Path(os.environ[CONFIG_ENV])
    elif path is None and _exists(default_config_file()):
        path = default_config_file()
    file_data = _read_config_file(path.expanduser()) if path is not None else {}
    init: dict[str, Any] = {}
    for keys, (_, value) in flags.items():
        node = init
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    token = FILE_DATA.set(file_data)
    names_token = RULE_NAMES.set(rule_names)
    try:
        settings = Settings(**init)
    except ValidationError as exc:
        err = exc.errors()[0]
        origin, in_file = _origin(err["loc"], flags, path, file_data)
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown setting (see docs/configuration.md)"
        elif err["type"] not in ("value_error",) and "input" in err and not isinstance(err["input"], (dict, list)):
            msg += f" (got {mask_secrets(repr(err['input']))})"
        sep = " " if origin.endswith("]") else ": "  # "[rules.thresholds] key: …", "[agent] interval: …"
        msg = mask_secrets(msg)
        if len(msg) > _MESSAGE_LENGTH:  # a value of 100 000 characters was repeated whole
            msg = msg[: _MESSAGE_LENGTH - 1] + "…"
        raise (ConfigFileError if in_file else UsageError)(f"invalid {origin}{sep}{msg}") from None
    except _PydanticSettingsError as exc:  # VGPUMON_<SECTION> set to something that is not JSON
        m = re.search(r'field "(\w+)"', str(exc))
        name = ENV_PREFIX + m.group(1).upper() if m else "environment"
        raise UsageError(f"invalid {name}: a whole section must be a JSON object; set {name}__<KEY> instead") from None
    finally:
        RULE_NAMES.reset(names_token)
        FILE_DATA.reset(token)
    origins: dict[str, str] = {}
    for leaf in leaves(Settings):
        origin, _ = _origin(leaf, flags, path, file_data)
        origins[".".join(leaf)] = origin if origin != ".".join(leaf) else "default"
    if settings.store.rollup_retention < settings.store.raw_retention:
        origin, in_file = _origin(("store", "rollup_retention"), flags, path, file_data)
        if origin == "store.rollup_retention":
            origin, in_file = _origin(("store", "raw_retention"), flags, path, file_data)
        raise (ConfigFileError if in_file else UsageError)(
            f"invalid {origin}: rollups ({format_duration(settings.store.rollup_retention)}) must be kept at least as long "
            f"as raw rows ({format_duration(settings.store.raw_retention)})"
        )
    if settings.store.url is None:
        settings.store.url = default_db_url()
    if settings.agent.hostname is None:
        settings.agent.hostname = default_hostname()
    if settings.agent.spool is None:
        settings.agent.spool = default_spool_dir(settings.store.url)
    settings._origins = origins  # type: ignore[attr-defined]
    settings._config_file = path  # type: ignore[attr-defined]
    return settings
