#!/bin/bash
# Two revisions' agents side by side on one GPU host, at the same time, twice: each with every
# default feature on (vLLM discovery, /metrics, rules, SQLite), its own store and port, CPU and
# resident memory over 120 s after 30 s (bench/agent_footprint.py), the bare 1 Hz loop beside.
# A host's own speed moves the absolute figures by a fifth between machines (docs/benchmarks.md,
# "Agent footprint"); run together, the two revisions see the same host.
#
#   git archive REV vgpumon bench | tar -x -C /tmp/old   # the revision to compare against
#   OLD=/tmp/old OUT=DIR bash bench/footprint_pair.sh
set -u
OLD=${OLD:?set OLD to a directory holding the other revision: vgpumon/ and bench/}
OUT=${OUT:-/tmp/vgpumon-pair}
mkdir -p "$OUT"
OLD=$(cd "$OLD" && pwd)
env -u PYTHONDONTWRITEBYTECODE python3 -m compileall -q vgpumon bench "$OLD/vgpumon" "$OLD/bench" > /dev/null
for round in 1 2; do
  rm -rf /tmp/vgpumon-pair-*
  python3 -m vgpumon db upgrade --db sqlite:////tmp/vgpumon-pair-new.db > /dev/null
  (cd "$OLD" && PYTHONPATH="$OLD${PYTHONPATH:+:$PYTHONPATH}" python3 -m vgpumon db upgrade --db sqlite:////tmp/vgpumon-pair-old.db > /dev/null)
  (cd "$OLD" && PYTHONPATH="$OLD${PYTHONPATH:+:$PYTHONPATH}" python3 bench/agent_footprint.py --warmup 30 --measure 120 --every 5 \
      --marks 35,60,120 --json "$OUT/old-$round.json" -- --db sqlite:////tmp/vgpumon-pair-old.db \
      --spool /tmp/vgpumon-pair-old-spool --listen 127.0.0.1:19401 > "$OUT/old-$round.txt" 2>&1) &
  python3 bench/agent_footprint.py --warmup 30 --measure 120 --every 5 --marks 35,60,120 --bare --json "$OUT/new-$round.json" \
      -- --db sqlite:////tmp/vgpumon-pair-new.db --spool /tmp/vgpumon-pair-new-spool --listen 127.0.0.1:19400 > "$OUT/new-$round.txt" 2>&1
  wait
  echo "== round $round: the other revision, then this one"
  grep -h "^agent\|^bare\|threads, %" "$OUT/old-$round.txt" "$OUT/new-$round.txt"
done
