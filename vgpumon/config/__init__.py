"""Settings: one typed object, read from a TOML file, ``VGPUMON_*`` environment variables and
command-line flags (docs/configuration.md).

Precedence, highest first: a command-line flag, then the environment, then the config file, then
the default. Every value is validated once, here, whatever its origin; an invalid one is reported
in one line that names where it came from (``--window``, ``VGPUMON_STORE__URL``,
``config.toml: [diagnose] window``). Sections (``[store]``, ``[agent]``, ``[vllm]``,
``[diagnose]``, ``[exporter]``, ``[rules]``, ``[api]``) are pydantic models: a new feature adds
its own section as one more field of ``Settings``.

Environment variables: ``VGPUMON_<SECTION>__<KEY>`` for every setting (``VGPUMON_STORE__URL``,
``VGPUMON_AGENT__INTERVAL``), plus the short names the README documents (``VGPUMON_DB``,
``VGPUMON_HOSTNAME``, ... in ``ENV_ALIASES``); the long form wins when both are set. Empty
variables count as unset.

The modules, one job each:

- ``checks``: value checks without a model (host names, URLs, the listen address);
- ``sections``: the sections' models, their fields, defaults and ranges;
- ``settings``: ``Settings`` and the sources it reads, in order of precedence;
- ``defaults``: the defaults that depend on the machine (store, spool, config file, host name);
- ``loading``: ``load_settings``, the config file, and the one-line error that names the origin;
- ``show``: the effective settings as plain data, for ``vgpumon config show``.

Every name below is importable from ``vgpumon.config`` and imported on first use, from the module
that defines it: importing one module of the package (``vgpumon.config.defaults``) does not load
pydantic and the others.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vgpumon.base.durations import MAX_DURATION_S as MAX_DURATION_S
    from vgpumon.base.durations import format_duration as format_duration
    from vgpumon.base.durations import parse_duration as parse_duration
    from vgpumon.config.checks import check_alert_url as check_alert_url
    from vgpumon.config.checks import check_hostname as check_hostname
    from vgpumon.config.checks import check_store_url as check_store_url
    from vgpumon.config.checks import normalise_vllm_url as normalise_vllm_url
    from vgpumon.config.defaults import default_config_file as default_config_file
    from vgpumon.config.defaults import default_db_url as default_db_url
    from vgpumon.config.defaults import default_hostname as default_hostname
    from vgpumon.config.defaults import default_spool_dir as default_spool_dir
    from vgpumon.config.loading import CONFIG_ENV as CONFIG_ENV
    from vgpumon.config.loading import Flags as Flags
    from vgpumon.config.loading import load_settings as load_settings
    from vgpumon.config.sections import AgentSettings as AgentSettings
    from vgpumon.config.sections import ApiSettings as ApiSettings
    from vgpumon.config.sections import DiagnoseSettings as DiagnoseSettings
    from vgpumon.config.sections import Duration as Duration
    from vgpumon.config.sections import ExporterSettings as ExporterSettings
    from vgpumon.config.sections import RulesSettings as RulesSettings
    from vgpumon.config.sections import StoreSettings as StoreSettings
    from vgpumon.config.sections import VllmSettings as VllmSettings
    from vgpumon.config.settings import ENV_ALIASES as ENV_ALIASES
    from vgpumon.config.settings import ENV_PREFIX as ENV_PREFIX
    from vgpumon.config.settings import LogLevel as LogLevel
    from vgpumon.config.settings import Settings as Settings
    from vgpumon.config.show import field_descriptions as field_descriptions
    from vgpumon.config.show import settings_document as settings_document

#: Each name of the package → the module that defines it (the imports above, for the type checker).
_HOME: dict[str, str] = {
    **dict.fromkeys(("MAX_DURATION_S", "format_duration", "parse_duration"), "vgpumon.base.durations"),
    **dict.fromkeys(("check_alert_url", "check_hostname", "check_store_url", "normalise_vllm_url"),
                    "vgpumon.config.checks"),
    **dict.fromkeys(("default_config_file", "default_db_url", "default_hostname", "default_spool_dir"),
                    "vgpumon.config.defaults"),
    **dict.fromkeys(("CONFIG_ENV", "Flags", "load_settings"), "vgpumon.config.loading"),
    **dict.fromkeys(("AgentSettings", "ApiSettings", "DiagnoseSettings", "Duration", "ExporterSettings",
                     "RulesSettings", "StoreSettings", "VllmSettings"), "vgpumon.config.sections"),
    **dict.fromkeys(("ENV_ALIASES", "ENV_PREFIX", "LogLevel", "Settings"), "vgpumon.config.settings"),
    **dict.fromkeys(("field_descriptions", "settings_document"), "vgpumon.config.show"),
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})
