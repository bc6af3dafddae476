"""Moved to ``vgpumon.testing.fake_nvml`` (the tests use it too); kept for the bench scripts."""

from vgpumon.testing.fake_nvml import *  # noqa: F401,F403
from vgpumon.testing.fake_nvml import install  # noqa: F401
