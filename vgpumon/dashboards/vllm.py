"""vLLM serving: per server its state, requests, KV cache and fragmentation, token rates, latency
percentiles, prewarm, and the GPUs it holds. Ratios are per server, never summed across them."""

from __future__ import annotations

from vgpumon.dashboards.kit import Q, mappings, stat, states, table, ts, unit, variables, yes_no
from vgpumon.dashboards.kit import dashboard as make

SRV = '{hostname=~"$host", model_name=~"$model"}'
BY_SERVER = "{{hostname}} {{server}} {{model_name}}"


def _latency(title: str, metric: str, what: str):
    return ts(title, f"{what}: 50th, 95th and 99th percentile over each poll interval, from the histogram's increments.",
              Q(f"{metric}{SRV}", BY_SERVER + " p{{percentile}}"), unit=unit(metric), w=8)


def serving():
    return make(
        "vgpumon-vllm", "vLLM serving",
        "vLLM servers: state, requests, KV cache and its fragmentation, token rates, latency percentiles, SLO attainment, "
        "KV offload, speculative decoding, LMCache, prewarm, and the GPUs each server holds.",
        ["vllm"], variables("vgpumon_vllm_server_info", "model_name", "Served model", "vgpumon_gpu_info"),
        [
            ("Servers", [
                table("Servers now", "Each server's state (starting, ready, busy, idle, hung, sleeping, telemetry_down, dead, "
                      "failed_to_start) and version.", Q(f"vgpumon_vllm_server_state{SRV} == 1"),
                      unit="none", hide=("Time", "__name__", "Value"), w=12),
                table("GPUs each server holds", "GPUs holding a process of the server (discovered servers; a --vllm-url target's "
                      "processes are not visible to the agent).",
                      Q('vgpumon_vllm_server_gpu_info{hostname=~"$host", model_name=~"$model", gpu=~"$gpu"}'),
                      unit="none", hide=("Time", "__name__", "Value"), w=12),
                states("State", "The server's state over time.",
                       Q(f"vgpumon_vllm_server_state{SRV} == 1", BY_SERVER + " {{state}}"), maps=mappings({1: "current"})),
                stat("Prewarm", "Process start (or first sight) to the first /health 200: weights, KV-cache sizing, CUDA-graph capture.",
                     Q(f"vgpumon_vllm_prewarm_seconds{SRV}", BY_SERVER), unit=unit("vgpumon_vllm_prewarm_seconds"), w=8),
                stat("GPU activity during prewarm", "Mean SM activity of the server's GPUs during its prewarm.",
                     Q(f"vgpumon_vllm_prewarm_gpu_active_ratio{SRV}", BY_SERVER), unit=unit("vgpumon_vllm_prewarm_gpu_active_ratio"), w=8),
                stat("/health status", "HTTP status of /health: 200 ready; 500/503 engine dead.",
                     Q(f"vgpumon_vllm_health_status_code{SRV}", BY_SERVER), unit="none", w=8,
                     thresholds=[(None, "green"), (300, "red")]),
            ]),
            ("Requests and KV cache", [
                ts("Requests running", "Summed over the server's engines.", Q(f"vgpumon_vllm_requests_running{SRV}", BY_SERVER),
                   unit=unit("vgpumon_vllm_requests_running"), w=8),
                ts("Requests waiting", "Summed over engines; from 0.20 deferred requests count too.", Q(f"vgpumon_vllm_requests_waiting{SRV}", BY_SERVER),
                   unit=unit("vgpumon_vllm_requests_waiting"), w=8),
                ts("Requests running per engine", "Data-parallel engines apart.", Q(f"vgpumon_vllm_engine_requests_running{SRV}", BY_SERVER + " engine {{engine}}"),
                   unit=unit("vgpumon_vllm_engine_requests_running"), w=8),
                ts("KV-cache usage", "Blocks in use, the fullest engine of each server (a share per server: never summed across servers).",
                   Q(f"vgpumon_vllm_kv_cache_usage_ratio{SRV}", BY_SERVER), unit=unit("vgpumon_vllm_kv_cache_usage_ratio"), max_=1, w=8),
                ts("KV-cache fragmentation (estimate)", "Estimated share of used KV slots that hold no token: the tail of each "
                   "sequence's last block. High when many short requests hold one block each.",
                   Q(f"vgpumon_vllm_kv_cache_fragmentation_ratio{SRV}", BY_SERVER), unit=unit("vgpumon_vllm_kv_cache_fragmentation_ratio"), max_=1, w=8),
                ts("Prefix-cache hits", "Hits over queries in each poll interval.", Q(f"vgpumon_vllm_prefix_cache_hit_ratio{SRV}", BY_SERVER),
                   unit=unit("vgpumon_vllm_prefix_cache_hit_ratio"), max_=1, w=8),
            ]),
            ("Throughput and latency", [
                ts("Token rates", "Prompt and generated tokens per second over each poll interval.",
                   Q(f"vgpumon_vllm_prompt_tokens_per_second{SRV}", BY_SERVER + " prompt"),
                   Q(f"vgpumon_vllm_generation_tokens_per_second{SRV}", BY_SERVER + " generated"),
                   unit=unit("vgpumon_vllm_prompt_tokens_per_second")),
                ts("Energy per generated token", "Joules the server's GPUs used per generated token, over the newest "
                   "interval between two energy reads (each minute); a GPU shared with other processes is split by the "
                   "memory they hold. No point for an interval without tokens.",
                   Q(f"vgpumon_vllm_energy_per_generated_token_joules{SRV}", BY_SERVER),
                   unit=unit("vgpumon_vllm_energy_per_generated_token_joules"), w=8),
                ts("Energy per generated token, host", "All the energy charged to the host's servers over their newest "
                   "intervals (idle servers' included) over all their generated tokens.",
                   Q('sum by (hostname) (vgpumon_vllm_energy_interval_joules{hostname=~"$host"})\n'
                     '/ (sum by (hostname) (vgpumon_vllm_energy_interval_joules{hostname=~"$host"}\n'
                     '  / (vgpumon_vllm_energy_per_generated_token_joules{hostname=~"$host"} > 0)) > 0)', "{{hostname}}"),
                   unit=unit("vgpumon_vllm_energy_per_generated_token_joules"), w=8),
                ts("Requests finished and preempted", "Per second over each poll interval.",
                   Q(f"vgpumon_vllm_requests_finished_per_second{SRV}", BY_SERVER + " finished"),
                   Q(f"vgpumon_vllm_preemptions_per_second{SRV}", BY_SERVER + " preempted"),
                   unit=unit("vgpumon_vllm_requests_finished_per_second")),
                _latency("Time to first token", "vgpumon_vllm_time_to_first_token_seconds", "Time to first token"),
                _latency("Inter-token latency", "vgpumon_vllm_inter_token_latency_seconds", "Time between output tokens"),
                _latency("End-to-end latency", "vgpumon_vllm_e2e_request_latency_seconds", "Request end to end"),
                _latency("Queue time", "vgpumon_vllm_request_queue_time_seconds", "Time in the queue"),
            ]),
            ("Serving objectives and newer signals", [
                ts("SLO attainment (goodput)", "Share of requests whose time to first token, and of token intervals whose latency, "
                   "stayed within their targets ([rules.thresholds] vllm_slo_ttft_seconds, vllm_slo_itl_seconds; 0.5 s and 50 ms by "
                   "default) over the SLO window, from the histograms' bucket increments (a target between bucket bounds is "
                   "interpolated: vgpumon_vllm_*_slo_interpolated). No point without requests. VllmSloAttainmentLow fires below "
                   "99 % (TTFT) or 95 % (inter-token) for 5 min.",
                   Q(f"vgpumon_vllm_ttft_slo_attainment_ratio{SRV}", BY_SERVER + " TTFT"),
                   Q(f"vgpumon_vllm_itl_slo_attainment_ratio{SRV}", BY_SERVER + " inter-token"),
                   unit=unit("vgpumon_vllm_ttft_slo_attainment_ratio"), max_=1, w=8),
                ts("Observations behind the SLO figures", "Requests (TTFT) and token intervals (inter-token latency) in the SLO window.",
                   Q(f"vgpumon_vllm_ttft_slo_observations{SRV}", BY_SERVER + " requests"),
                   Q(f"vgpumon_vllm_itl_slo_observations{SRV}", BY_SERVER + " token intervals"),
                   unit=unit("vgpumon_vllm_ttft_slo_observations"), w=8),
                states("Hung servers", "A server hung: work queued with its counters flat and its engine using no CPU, an engine "
                       "process stopped or in uninterruptible sleep for 3 polls, or the generation probe unanswered by its deadline "
                       "(docs/vllm.md, \"Hung, not slow\"). /health may still answer 200.",
                       Q('vgpumon_vllm_server_state{hostname=~"$host", model_name=~"$model", state="hung"} == 1', BY_SERVER),
                       maps=mappings({1: "hung"}), w=8),
                ts("KV offload traffic", "Bytes per second vLLM's KV offload (OffloadingConnector, 0.33) moved over each poll "
                   "interval: loaded from CPU memory into the GPUs (host-to-device: part of their PCIe RX) and stored from them "
                   "(device-to-host: part of their TX). diagnose and capacity say what share of the GPUs' PCIe traffic it is.",
                   Q(f"vgpumon_vllm_kv_offload_load_bytes_per_second{SRV}", BY_SERVER + " load (H2D)"),
                   Q(f"vgpumon_vllm_kv_offload_store_bytes_per_second{SRV}", BY_SERVER + " store (D2H)"),
                   unit=unit("vgpumon_vllm_kv_offload_load_bytes_per_second"), w=8),
                ts("Speculative-decoding acceptance", "Draft tokens accepted over draft tokens proposed in each poll interval "
                   "(no point without drafts). A falling rate costs the draft model's work for nothing.",
                   Q(f"vgpumon_vllm_spec_decode_acceptance_ratio{SRV}", BY_SERVER),
                   unit=unit("vgpumon_vllm_spec_decode_acceptance_ratio"), max_=1, w=8),
                ts("LMCache hit ratio", "Servers running LMCache's connector: tokens LMCache's retrieves found over tokens they "
                   "asked for, and tokens its lookups found cached over tokens looked up (the scheduler's view), in each poll "
                   "interval; no point without a retrieve or lookup. Every tensor-parallel rank counted, pid splits summed.",
                   Q(f"vgpumon_vllm_lmcache_retrieve_hit_ratio{SRV}", BY_SERVER + " retrieve"),
                   Q(f"vgpumon_vllm_lmcache_lookup_hit_ratio{SRV}", BY_SERVER + " lookup"),
                   unit=unit("vgpumon_vllm_lmcache_retrieve_hit_ratio"), max_=1, w=8),
                ts("LMCache local cache", "Bytes LMCache's local CPU cache holds, summed over the server's ranks and processes: "
                   "host memory the KV cache layer takes beside the GPUs'.",
                   Q(f"vgpumon_vllm_lmcache_local_cache_usage_bytes{SRV}", BY_SERVER),
                   unit=unit("vgpumon_vllm_lmcache_local_cache_usage_bytes"), w=8),
                ts("LMCache traffic", "Tokens per second LMCache retrieved into the GPUs (prefill it saved) and stored from them, "
                   "over each poll interval: the largest rank's, since every tensor-parallel rank handles each request's tokens.",
                   Q(f"vgpumon_vllm_lmcache_hit_tokens_per_second{SRV}", BY_SERVER + " retrieved"),
                   Q(f"vgpumon_vllm_lmcache_stored_tokens_per_second{SRV}", BY_SERVER + " stored"),
                   unit=unit("vgpumon_vllm_lmcache_hit_tokens_per_second"), w=8),
            ]),
            ("Server health", [
                ts("Telemetry and frozen gauges", "Telemetry: /metrics answered. Stale: vLLM's gauges did not move (an idle engine "
                   "stops updating them).", Q(f"vgpumon_vllm_telemetry_up{SRV}", BY_SERVER + " telemetry"),
                   Q(f"vgpumon_vllm_gauges_stale{SRV}", BY_SERVER + " gauges stale"), unit="none", maps=yes_no(), max_=1),
                ts("Server load (/load)", "Requests the API server tracks (0.8.5+, with --enable-server-load-tracking).",
                   Q(f"vgpumon_vllm_server_load{SRV}", BY_SERVER), unit=unit("vgpumon_vllm_server_load")),
                ts("Server host memory (RSS)", "Resident memory of the server's process tree (discovered servers).",
                   Q(f"vgpumon_vllm_resident_memory_bytes{SRV}", BY_SERVER), unit=unit("vgpumon_vllm_resident_memory_bytes")),
                ts("Server CPU", "Cores the server's process tree uses (discovered servers).",
                   Q(f"vgpumon_vllm_cpu_seconds_per_second{SRV}", BY_SERVER), unit=unit("vgpumon_vllm_cpu_seconds_per_second")),
            ]),
        ],
    )
