"""``python -m vgpumon.catalogue > docs/metrics.md`` writes the metrics reference."""

import sys

from vgpumon.catalogue import render_markdown

sys.stdout.write(render_markdown())
