#!/bin/bash
# The agent's threads on a GPU host: CPU per wake-up of a bare thread (bench/wake_cost.py), then
# for a default agent, per thread over 60 s: wake-ups (voluntary context switches), CPU from
# schedstat, and a 60-s py-spy profile (raw, --threads). Writes under $OUT.
set -u
OUT=${OUT:-/tmp/prof}; mkdir -p $OUT
PY=python3
for m in event lock sleep; do $PY bench/wake_cost.py $m; done | tee $OUT/wake.txt
rm -rf /tmp/p.db* /tmp/p-spool
$PY -m vgpumon db upgrade --db sqlite:////tmp/p.db
$PY -m vgpumon agent --db sqlite:////tmp/p.db --spool /tmp/p-spool > $OUT/agent.log 2>&1 &
sleep 25
pid=$(pgrep -f "vgpumon agent" | head -1)
snap(){ for t in /proc/$pid/task/*; do echo "$(cat $t/comm | tr ' ' _) $(grep '^voluntary_ctxt_switches' $t/status | awk '{print $2}') $(grep '^nonvoluntary_ctxt_switches' $t/status | awk '{print $2}') $(awk '{print $1}' $t/schedstat)"; done; }
snap > /tmp/a; sleep 60; snap > /tmp/b
paste /tmp/a /tmp/b | awk '{printf "%-18s %6.2f wakes/s %6.2f invol/s %7.3f ms/s %6.1f us/wake\n",$1,($6-$2)/60,($7-$3)/60,($8-$4)/60/1e6, (($6-$2)>0)?(($8-$4)/($6-$2)/1e3):0}' | tee $OUT/threads.txt
py-spy record -p $pid -r 2000 -d 60 -f raw -o $OUT/spy.txt --threads --nonblocking > /dev/null 2>&1
kill -INT $pid; sleep 3
tail -2 $OUT/agent.log
