"""What an operator deploys: the metric selection file, the Prometheus scrape configs (checked
by the real promtool), the systemd unit, the Kubernetes manifests and the compose demo — each
agreeing with the agent's port, endpoints and options."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import H200_CAPTURE, ROOT
from exporter_support import fed, scrape, snapshots
from prometheus_support import tool

from vgpumon import catalogue
from vgpumon.exporter import DEFAULT_LISTEN, DEFAULT_PORT, parse_listen
from vgpumon.exporter.selection import SelectionError, parse_selection, read_selection, render_selection
from vgpumon.sources.nvml.capture import ReplayBackend

pytestmark = pytest.mark.slow  # starts processes or servers: not in the quick subset (docs/testing.md)

EXPORTERS = ROOT / "exporters"
IDENTITY = {"hostname": "h200-replay", "gpu": "0", "uuid": "GPU-00000000-0000-4000-8000-000000000000"}


def test_metrics_csv_is_generated_from_the_catalogue_and_selects_every_family():
    text = (EXPORTERS / "metrics.csv").read_text()
    assert text == render_selection(), "run: python -m vgpumon.exporter.selection > exporters/metrics.csv"
    assert read_selection(EXPORTERS / "metrics.csv") == frozenset(catalogue.families())


def test_a_commented_out_family_is_not_served(tmp_path):
    lines = (EXPORTERS / "metrics.csv").read_text().splitlines()
    edited = ["# " + ln if ln.startswith(("vgpumon_gpu_power_usage_watts,", "vgpumon_gpu_clocks_event_reason_active,")) else ln for ln in lines]
    selection = parse_selection("\n".join(edited))
    m = scrape(fed(snapshots(ReplayBackend(H200_CAPTURE))[:5], selection=selection))
    assert m.value("vgpumon_gpu_power_usage_watts", **IDENTITY) is None
    assert m.series("vgpumon_gpu_clocks_event_reason_active") == []
    assert m.value("vgpumon_gpu_temperature_celsius", **IDENTITY) is not None


def test_a_selection_naming_an_unknown_family_or_a_wrong_type_is_refused_with_its_line():
    with pytest.raises(SelectionError, match="line 2: 'DCGM_FI_DEV_GPU_TEMP' is not a vgpumon metric"):
        parse_selection("vgpumon_gpu_up, gauge, up\nDCGM_FI_DEV_GPU_TEMP, gauge, temperature\n")
    with pytest.raises(SelectionError, match="line 1: vgpumon_gpu_energy_joules_total is a counter, not a gauge"):
        parse_selection("vgpumon_gpu_energy_joules_total, gauge, energy\n")


def _agent(*args: str, db: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vgpumon", "agent", "--listen", "off", "--replay", str(H200_CAPTURE), "--db", f"sqlite:///{db}", *args],
        capture_output=True, text=True, timeout=120,
    )


@pytest.mark.parametrize("listen", ["19400", "localhost", "127.0.0.1:99999", "[zz::1]:19400"])
def test_a_malformed_listen_address_is_a_usage_error_before_anything_is_stored(tmp_path, listen):
    out = _agent("--listen", listen, db=tmp_path / "x.db")
    assert out.returncode == 64, out.stderr
    assert "--listen" in out.stderr
    assert not (tmp_path / "x.db").exists()


def test_a_bad_metrics_file_is_an_input_file_error_naming_its_line(tmp_path):
    """The selection file is an input file, as a config file or a capture: 65, not 64."""
    bad = tmp_path / "metrics.csv"
    bad.write_text("vgpumon_gpu_up, gauge, up\nvgpumon_gpu_util, gauge, typo\n")
    out = _agent("--metrics-file", str(bad), db=tmp_path / "x.db")
    assert out.returncode == 65 and "line 2" in out.stderr and "vgpumon_gpu_util" in out.stderr
    out = _agent("--metrics-file", str(tmp_path / "missing.csv"), db=tmp_path / "x.db")
    assert out.returncode == 65 and "missing.csv" in out.stderr


def test_a_metrics_file_that_selects_nothing_is_refused_not_served_empty(tmp_path):
    """An empty (or wholly commented-out) selection would serve an empty /metrics: Prometheus
    scrapes succeed, every dashboard is blank, nothing says why."""
    empty = tmp_path / "metrics.csv"
    empty.write_text("# vgpumon_gpu_up, gauge, up\n\n")
    out = _agent("--metrics-file", str(empty), db=tmp_path / "x.db")
    assert out.returncode == 65 and "selects no metric family" in out.stderr and "--listen off" in out.stderr
    assert not (tmp_path / "x.db").exists()


def test_a_port_in_use_costs_metrics_never_the_samples(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = _agent("--listen", f"127.0.0.1:{port}", db=tmp_path / "x.db")
    assert out.returncode == 0, out.stderr
    assert "cannot serve /metrics on 127.0.0.1" in out.stderr
    assert " 76 rows stored" in out.stderr


def test_listen_forms():
    assert parse_listen(DEFAULT_LISTEN) == ("127.0.0.1", DEFAULT_PORT)
    assert parse_listen(":19400") == ("0.0.0.0", 19400)
    assert parse_listen("[::1]:19400") == ("::1", 19400)
    assert parse_listen("off") is None


@pytest.mark.parametrize("config", ["prometheus/prometheus.yml", "compose/prometheus.yml"])
def test_prometheus_configs_pass_promtool_check_config(config):
    out = subprocess.run([tool("promtool"), "check", "config", str(EXPORTERS / config)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def _docs(path: Path) -> dict[str, dict]:
    return {d["kind"]: d for d in yaml.safe_load_all(path.read_text()) if d}


def test_daemonset_mounts_the_pod_resources_directory_and_serves_on_the_default_port():
    ds = _docs(EXPORTERS / "kubernetes" / "daemonset.yaml")["DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    (c,) = spec["containers"]
    assert c["args"] == ["agent", "--listen", f"0.0.0.0:{DEFAULT_PORT}"]
    assert c["ports"] == [{"name": "metrics", "containerPort": DEFAULT_PORT}]
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    mount = next(m for m in c["volumeMounts"] if m["name"] == "pod-resources")
    assert mount == {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": True}
    vol = next(v for v in spec["volumes"] if v["name"] == "pod-resources")
    assert vol["hostPath"] == {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}  # the directory, not the socket
    assert c["securityContext"]["runAsUser"] == 0
    svc = _docs(EXPORTERS / "kubernetes" / "service.yaml")["Service"]
    mon = _docs(EXPORTERS / "kubernetes" / "servicemonitor.yaml")["ServiceMonitor"]
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": DEFAULT_PORT, "targetPort": "metrics"}]
    assert mon["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert mon["spec"]["endpoints"][0]["port"] == "metrics" and mon["spec"]["endpoints"][0]["path"] == "/metrics"
    # the agent-down alert names a host by its instance's host part: the node's name, as the agent's hostname
    (relabel,) = mon["spec"]["endpoints"][0]["relabelings"]
    assert relabel["sourceLabels"] == ["__meta_kubernetes_pod_node_name"] and relabel["targetLabel"] == "instance"
    assert relabel["replacement"] == f"${{1}}:{DEFAULT_PORT}"
    assert {d["metadata"]["namespace"] for d in (ds, svc, mon)} == {_docs(EXPORTERS / "kubernetes" / "namespace.yaml")["Namespace"]["metadata"]["name"]}


def test_systemd_unit_serves_on_every_interface_and_stops_with_sigterm():
    unit = (EXPORTERS / "systemd" / "vgpumon-agent.service").read_text()
    assert re.search(rf"^Environment=VGPUMON_LISTEN=0\.0\.0\.0:{DEFAULT_PORT}$", unit, re.M)
    assert re.search(r"^ExecStart=/opt/vgpumon/bin/vgpumon agent$", unit, re.M)  # the venv of docs/deploy.md
    assert re.search(r"^KillSignal=SIGTERM$", unit, re.M)
    assert re.search(r"^RestartPreventExitStatus=69$", unit, re.M)  # no driver: restarting will not help


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze (systemd)")
def test_systemd_analyze_verifies_the_unit_clean(tmp_path):
    """`systemd-analyze verify` on the unit, its ExecStart pointed at this test's own install of
    vgpumon in place of /opt/vgpumon (which the test may not create): no warning, exit 0.
    Before, the unit named /usr/local/bin/vgpumon, which nothing created."""
    script = Path(sys.executable).with_name("vgpumon")
    assert script.exists(), "the test's install has no vgpumon script"
    unit = (EXPORTERS / "systemd" / "vgpumon-agent.service").read_text().replace("/opt/vgpumon/bin/vgpumon", str(script))
    path = tmp_path / "vgpumon-agent.service"
    path.write_text(unit)
    out = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and not out.stderr.strip() and not out.stdout.strip(), out.stdout + out.stderr


def test_compose_mounts_what_the_repository_has_and_pins_its_images():
    compose = yaml.safe_load((EXPORTERS / "compose" / "docker-compose.yml").read_text())
    base = EXPORTERS / "compose"
    for name, svc in compose["services"].items():
        assert not svc["image"].endswith(":latest") and ":" in svc["image"], name
        for vol in svc.get("volumes", []):
            host = (base / vol.split(":")[0]).resolve()
            # rules/ is generated by the rules engine (issue 11), which lands beside this
            assert host.exists() or host == ROOT / "rules", f"{name}: {vol}"
    assert compose["services"]["grafana"]["image"].startswith("grafana/grafana:11.6")  # the SDK's build
    targets = yaml.safe_load((base / "targets" / "agents.yml").read_text())
    assert all(t.endswith(f":{DEFAULT_PORT}") for group in targets for t in group["targets"])
    demo = compose["services"]["vgpumon-demo"]
    command = " ".join(demo["command"])
    assert f"--listen 0.0.0.0:{DEFAULT_PORT}" in command
    # the capture it replays is in the directory it mounts
    mounts = {v.split(":")[1]: (base / v.split(":")[0]).resolve() for v in demo["volumes"]}
    (replayed,) = re.findall(r"--replay (\S+)", command)
    mount, rel = next((m, replayed[len(m) + 1:]) for m in mounts if replayed.startswith(m + "/"))
    assert (mounts[mount] / rel).exists(), replayed


def test_the_manifests_name_the_image_the_containerfile_builds():
    """The DaemonSet and the compose demo run the image of the repository's Containerfile, at
    the package's version, with the entry point and default command they rely on."""
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    containerfile = (ROOT / "Containerfile").read_text()
    assert f'org.opencontainers.image.version="{version}"' in containerfile
    assert 'ENTRYPOINT ["vgpumon"]' in containerfile
    assert f'CMD ["agent", "--listen", "0.0.0.0:{DEFAULT_PORT}"]' in containerfile
    ds = _docs(EXPORTERS / "kubernetes" / "daemonset.yaml")["DaemonSet"]
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    assert c["image"] == f"vgpumon:{version}"
    compose = yaml.safe_load((EXPORTERS / "compose" / "docker-compose.yml").read_text())
    demo = compose["services"]["vgpumon-demo"]
    assert demo["image"] == f"vgpumon:{version}" and demo["build"]["dockerfile"] == "Containerfile"
    assert (EXPORTERS / "compose" / demo["build"]["context"]).resolve() == ROOT
    # what the build copies is in the repository, and nothing else goes into its context
    for src in re.findall(r"^COPY (?!--from)(.+) \S+$", containerfile, re.M):
        for path in src.split():
            assert (ROOT / path).exists(), path
    rules = [ln for ln in (ROOT / ".containerignore").read_text().splitlines() if ln and not ln.startswith("#")]
    assert rules[0] == "*"  # everything left out but what it names: no .git, .venv or store files
    env = {e["name"]: e for e in c["env"]}
    assert env["VGPUMON_API_TOKEN"]["valueFrom"]["secretKeyRef"]["optional"] is True
    mon = _docs(EXPORTERS / "kubernetes" / "servicemonitor.yaml")["ServiceMonitor"]
    assert mon["metadata"]["labels"]["release"] == "kube-prometheus-stack"
