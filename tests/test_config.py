"""The settings model: file, then environment, then flags; errors name the key."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vgpud.config import ENV_KEYS, ConfigError, load_settings, with_feature_gates
from vgpud.core.model import ComputePolicy, Policy
from vgpud.core.requests import PRESETS, enabled_presets


def test_defaults_are_the_documented_ones() -> None:
    s = load_settings()
    assert (s.deviceSplitCount, s.deviceMemoryScaling, s.defaultMem, s.defaultCores) == \
        (10, 1.0, 0, 0)
    assert s.resourcePreset == "vgpu-manager" and s.schedulerName == "vgpu-scheduler"
    gates = s.scheduler.featureGates
    assert (gates.Reschedule, gates.SerialBindNode) == (True, False)
    assert (s.scheduler.rescheduleBarePods, s.scheduler.rescheduleMaxAttempts,
            s.scheduler.rescheduleQPS) == (False, 3, 1.0)


def test_precedence_file_then_env_then_flags(tmp_path: Path) -> None:
    f = tmp_path / "vgpud.yaml"
    f.write_text("deviceSplitCount: 4\ndefaultCores: 20\nnodeSchedulerPolicy: spread\n"
                 "nodeConfigs: [{name: big, deviceMemoryScaling: 2.0}]\n")
    s = load_settings(f, env={"VGPUD_DEFAULT_CORES": "30", "VGPUD_COMPUTE_POLICY": "balance"},
                      overrides={"defaultCores": 40})
    assert s.deviceSplitCount == 4 and s.defaultCores == 40
    assert s.nodeSchedulerPolicy is Policy.SPREAD and s.computePolicy is ComputePolicy.BALANCE
    assert s.for_node("big") == (4, 2.0, 1.0) and s.for_node("other") == (4, 1.0, 1.0)
    d = s.defaults()
    assert d.split == 4 and d.default_cores == 40 and d.node_policy is Policy.SPREAD


def test_json_files_work(tmp_path: Path) -> None:
    f = tmp_path / "vgpud.json"
    f.write_text('{"resourcePreset": "hami", "compatPresets": ["tke"]}')
    s = load_settings(f)
    assert s.resourcePreset == "hami" and s.compatPresets == ("tke",)


@pytest.mark.parametrize(("content", "env", "fragment"), [
    ("deviceSplitCount: 0", {}, "deviceSplitCount: Input should be greater than or equal to 1"),
    ("deviceSplitcount: 3", {}, "deviceSplitcount: unknown key"),
    ("deviceMemoryScaling: .nan", {}, "deviceMemoryScaling"),
    ("resourcePreset: k8s", {}, "unknown preset 'k8s'"),
    ("defaultCores: 101", {}, "defaultCores"),
    ("- a\n- b", {}, "expected a mapping of settings"),
    ("a: [", {}, "not valid YAML"),
    ("nodeConfigs: [{name: a}, {name: a}]", {}, "configured twice"),
    ("scheduler: {rescheduleMaxAttempts: 0}", {}, "scheduler.rescheduleMaxAttempts: Input "
                                                  "should be greater than or equal to 1"),
    ("scheduler: {rescheduleMaxAttempts: 2.5}", {}, "scheduler.rescheduleMaxAttempts"),
    ("scheduler: {rescheduleQPS: 0}", {}, "scheduler.rescheduleQPS"),
    ("scheduler: {rescheduleQPS: .nan}", {}, "scheduler.rescheduleQPS"),
    ("scheduler: {rescheduleQPS: .inf}", {}, "scheduler.rescheduleQPS"),
    ("scheduler: {rescheduleBarePods: maybe}", {}, "scheduler.rescheduleBarePods"),
    ("scheduler: {featureGates: {Reschedul: false}}", {},
     "scheduler.featureGates.Reschedul: unknown key"),
    ("", {"VGPUD_DEVICE_SPLIT_COUNT": "many"}, "with VGPUD_DEVICE_SPLIT_COUNT"),
    ("resourceNames: {hami: {resourceName: example.com/gpu}}", {},
     "resourceNames: hami: the preset is not enabled"),
    ("resourceNames: {kai: {}}", {}, "resourceNames: unknown preset 'kai'"),
    ("resourceNames: {vgpu-manager: {resourceGPU: a.io/b}}", {},
     "resourceNames.vgpu-manager.resourceGPU: unknown key"),
    ("resourceNames: {vgpu-manager: {resourceName: vgpu}}", {},
     "vgpu-manager.resourceName: 'vgpu' has no domain"),
    ("resourceNames: {vgpu-manager: {domain: kubernetes.io}}", {}, "Kubernetes' own"),
    ("{resourcePreset: tke, resourceNames: {tke: {resourceCores: a.io/c}}}", {},
     "there is no resourceCores to rename"),
    ("{compatPresets: [hami], resourceNames: {hami: {resourceMem: nvidia.com/vgpu-memory}}}",
     {}, "nvidia.com/vgpu-memory is a name of both vgpu-manager and hami"),
    ("{resourcePreset: kai, resourceNames: {tke: {domain: inspur.com}}}", {},
     "resourcePreset: unknown preset 'kai'"),
])
def test_bad_settings_say_which_key(tmp_path: Path, content: str, env: dict[str, str],
                                    fragment: str) -> None:
    f = tmp_path / "vgpud.yaml"
    f.write_text(content)
    with pytest.raises(ConfigError) as e:
        load_settings(f, env=env)
    assert fragment in str(e.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(tmp_path / "nope.yaml")


def test_cli_reports_bad_config_without_a_traceback(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("deviceSplitCount: -2\n")
    out = subprocess.run([sys.executable, "-m", "vgpud", "scheduler", "--config", str(f)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "deviceSplitCount" in out.stderr and "Traceback" not in out.stderr


# -- --feature-gates (issue 24, item 3) -------------------------------------------------

@pytest.mark.parametrize(("spec", "plugin", "scheduler"), [
    # VGPU-Manager's first names (seed 000) and its newer ones mean the same gates
    ("CorePlugin=true,MemoryPlugin=true", {"CorePlugin": True, "MemoryPlugin": True}, {}),
    ("GPUCoreResourcePlugin=true,GPUMemoryResourcePlugin=true",
     {"CorePlugin": True, "MemoryPlugin": True}, {}),
    ("SerialBindNode=true, Reschedule=false", {}, {"SerialBindNode": True, "Reschedule": False}),
    ("SerializedNodeBind=true,AllocationFailureReschedule=false", {},
     {"SerialBindNode": True, "Reschedule": False}),
    # GPUTopology acts in both commands (it was refused)
    ("GPUTopology=false", {"GPUTopology": False}, {"GPUTopology": False}),
    ("TopologyAwareGPUAllocation=true", {"GPUTopology": True}, {"GPUTopology": True}),
])
def test_feature_gates_take_both_generations_of_names(
        spec: str, plugin: dict[str, bool], scheduler: dict[str, bool]) -> None:
    base = load_settings(None, env={})
    got, _ = with_feature_gates(base, spec, "scheduler")
    for name, value in plugin.items():
        assert getattr(got.plugin.featureGates, name) is value, name
    for name, value in scheduler.items():
        assert getattr(got.scheduler.featureGates, name) is value, name
    # nothing else moved
    untouched = {k: v for k, v in base.model_dump().items() if k not in ("plugin", "scheduler")}
    assert {k: v for k, v in got.model_dump().items() if k in untouched} == untouched


def test_feature_gates_say_what_is_wrong_and_where_a_gate_acts() -> None:
    base = load_settings(None, env={})
    with pytest.raises(ConfigError, match=r"unknown gate 'SMWatcher' \(known: .*CorePlugin"):
        with_feature_gates(base, "SMWatcher=true", "plugin")
    with pytest.raises(ConfigError, match="is not NAME=true or NAME=false"):
        with_feature_gates(base, "CorePlugin=yes", "plugin")
    with pytest.raises(ConfigError, match="is not NAME=true or NAME=false"):
        with_feature_gates(base, "CorePlugin", "plugin")
    _, notes = with_feature_gates(base, "Reschedule=true,CorePlugin=true", "plugin")
    assert notes == ["Reschedule acts in `vgpud scheduler`, not here: set it there"]
    assert with_feature_gates(base, None, "plugin") == (base, [])


def test_the_commands_take_feature_gates(tmp_path: Path) -> None:
    bad = subprocess.run([sys.executable, "-m", "vgpud", "scheduler",
                          "--feature-gates=Bogus=true"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "unknown gate 'Bogus'" in bad.stderr, bad.stderr
    # the gates parse, and the plugin goes on to its next check (no node name here)
    ok = subprocess.run([sys.executable, "-m", "vgpud", "plugin",
                         "--feature-gates=GPUTopology=true,CorePlugin=true"],
                        capture_output=True, text=True, timeout=60,
                        env={k: v for k, v in os.environ.items() if k != "NODE_NAME"})
    assert ok.returncode == 2 and "--node-name" in ok.stderr, ok.stderr


def test_resource_names_rename_each_peers_presets(tmp_path: Path) -> None:
    f = tmp_path / "vgpud.yaml"
    f.write_text("""
resourcePreset: tke
compatPresets: [hami, volcano]
resourceNames:
  tke: {domain: inspur.com}               # seed 004
  hami: {resourceName: example.com/gpu, resourceMem: example.com/gpumem,
         resourceCores: example.com/gpucores, resourceMemPercentage: "",
         resourcePriority: example.com/gpu-priority}
  volcano: {domain: gpu.example.org}
""")
    s = load_settings(f)
    tke, hami, volcano = s.presets()
    assert (tke.number, tke.memory) == ("inspur.com/vcuda-core", "inspur.com/vcuda-memory")
    assert hami.names == ("example.com/gpu", "example.com/gpumem", "example.com/gpucores",
                          "example.com/gpu-priority")
    assert volcano.memory_percent == "gpu.example.org/vgpu-memory-percentage"
    d = s.defaults()  # what the webhook, the scheduler and the plugin are given
    assert set(d.presets) == {tke, hami, volcano}
    assert enabled_presets(d) == [tke, hami, volcano]
    assert s.preset_named("vgpu-manager") == PRESETS["vgpu-manager"]  # not renamed
    assert load_settings().presets() == (PRESETS["vgpu-manager"],)
    assert "VGPUD_RESOURCE_NAMES" not in ENV_KEYS  # a mapping: the file only
