"""The settings object: ``Settings``, one field per section, and the sources it is read from in
order of precedence (the flags, ``VGPUMON_<SECTION>__<KEY>``, the short names of ``ENV_ALIASES``,
the config file). Built by ``vgpumon.config.loading.load_settings``, which also reads the file."""

from __future__ import annotations

import contextvars
import os
from pathlib import Path
from typing import Any, Iterator, Literal

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from vgpumon.config.sections import (
    AgentSettings,
    ApiSettings,
    DiagnoseSettings,
    ExporterSettings,
    RulesSettings,
    StoreSettings,
    VllmSettings,
)

ENV_PREFIX = "VGPUMON_"
#: Short environment names (documented in the README since before the settings object) → the
#: setting they set.
ENV_ALIASES: dict[str, tuple[str, str]] = {
    "VGPUMON_DB": ("store", "url"),
    "VGPUMON_RAW_RETENTION": ("store", "raw_retention"),
    "VGPUMON_ROLLUP_RETENTION": ("store", "rollup_retention"),
    "VGPUMON_HOSTNAME": ("agent", "hostname"),
    "VGPUMON_SPOOL": ("agent", "spool"),
    "VGPUMON_LISTEN": ("exporter", "listen"),
    "VGPUMON_METRICS_FILE": ("exporter", "metrics_file"),
    "VGPUMON_KUBELET_SOCKET": ("exporter", "kubelet_socket"),
    "VGPUMON_OTLP_URL": ("exporter", "otlp_url"),
    "VGPUMON_ALERT_WEBHOOKS": ("rules", "webhooks"),
    "VGPUMON_ALERTMANAGERS": ("rules", "alertmanagers"),
    "VGPUMON_VLLM_URLS": ("vllm", "urls"),
    "VGPUMON_API_TOKEN": ("api", "token"),
}

LogLevel = Literal["debug", "info", "warning", "error"]

FILE_DATA: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("vgpumon_config_file", default={})  # noqa: B039  the default is never mutated: each load sets its own dict


class _DictSource(PydanticBaseSettingsSource):
    """A settings source over a ready dict (the config file's table, the short env names)."""

    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self.data = data

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover - unused
        return self.data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return self.data


def _alias_env() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for var, (section, key) in ENV_ALIASES.items():
        value = os.environ.get(var)
        if value:
            out.setdefault(section, {})[key] = value
    return out


class Settings(BaseSettings):
    """Every setting of vgpumon, by section. Build it with ``load_settings``."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        env_ignore_empty=True,
        case_sensitive=False,
        extra="forbid",
        validate_default=True,
    )

    log_level: LogLevel = Field(default="warning", description="how much to log on stderr")
    store: StoreSettings = Field(default_factory=StoreSettings)
    agent: AgentSettings = Field(default_factory=AgentSettings)
    vllm: VllmSettings = Field(default_factory=VllmSettings)
    diagnose: DiagnoseSettings = Field(default_factory=DiagnoseSettings)
    exporter: ExporterSettings = Field(default_factory=ExporterSettings)
    rules: RulesSettings = Field(default_factory=RulesSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # flags > VGPUMON_<SECTION>__<KEY> > short names > config file > defaults; no .env files
        return init_settings, env_settings, _DictSource(settings_cls, _alias_env()), _DictSource(settings_cls, FILE_DATA.get())

    @property
    def origins(self) -> dict[str, str]:
        """Where each setting came from, by dotted path: a flag (``--db``), an environment
        variable, the config file (``FILE: [section] key``) or ``default``."""
        return dict(getattr(self, "_origins", {}))

    @property
    def config_file(self) -> Path | None:
        """The config file that was read, ``None`` when none was."""
        return getattr(self, "_config_file", None)


def leaves(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The path of every setting of the model, section by section (``("store", "url")``)."""
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from leaves(ann, (*prefix, name))
        else:
            yield (*prefix, name)
