"""Presets under other names (vgpud/core/requests.py ``renamed``, ``check_presets``):
every peer's names as its own system lets them change, read by the parser and the
admission code alike once they are in ``Defaults.presets``."""

import re

import pytest

from tests.builders import pod
from vgpud.core.admission import AdmissionPolicy, admit, is_gpu_pod, mutate
from vgpud.core.model import Defaults
from vgpud.core.requests import (
    PRESETS,
    PresetError,
    RequestError,
    check_presets,
    enabled_presets,
    parse_pod,
    renamed,
    resource_name_problem,
)

INSPUR = renamed(PRESETS["tke"], domain="inspur.com")
HAMI = renamed(PRESETS["hami"], names={
    "number": "example.com/vgpu", "memory": "example.com/vgpu-memory",
    "cores": "example.com/vgpu-cores", "memory_percent": "example.com/vgpu-memory-share",
    "priority": ""})


def limits(values: dict[str, object]) -> dict:
    return pod(containers=[{"name": "main", "resources": {"limits": values}}])


def test_a_domain_moves_every_name_but_the_mig_prefix() -> None:
    assert (INSPUR.number, INSPUR.memory, INSPUR.tke) == (
        "inspur.com/vcuda-core", "inspur.com/vcuda-memory", True)
    v = renamed(PRESETS["volcano"], domain="gpu.example.org")
    assert v.names == ("gpu.example.org/vgpu-number", "gpu.example.org/vgpu-memory",
                       "gpu.example.org/vgpu-cores", "gpu.example.org/vgpu-memory-percentage")
    vgm = renamed(PRESETS["vgpu-manager"], domain="corp.example")
    assert vgm.mig == "nvidia.com/mig-" and vgm.number == "corp.example/vgpu-number"


def test_single_names_apply_over_the_domain_and_optional_ones_may_go() -> None:
    h = renamed(PRESETS["hami"], domain="corp.example", names={"number": "corp.example/gpu-n",
                                                              "priority": ""})
    assert h.names == ("corp.example/gpu-n", "corp.example/gpumem", "corp.example/gpucores",
                       "corp.example/gpumem-percentage")
    assert HAMI.priority is None and HAMI.memory_percent == "example.com/vgpu-memory-share"
    assert renamed(PRESETS["hami"]) == PRESETS["hami"]


@pytest.mark.parametrize(("name", "fragment"), [
    ("vgpu", "has no domain"),
    ("Example.com/vgpu", "not a DNS subdomain"),
    ("example..com/vgpu", "not a DNS subdomain"),
    ("kubernetes.io/vgpu", "Kubernetes' own"),
    ("gpu.kubernetes.io/vgpu", "Kubernetes' own"),
    ("example.com/-vgpu", "not a resource name"),
    ("example.com/" + "v" * 64, "not a resource name"),
    ("example.com/", "not a resource name"),
])
def test_names_kubernetes_refuses(name: str, fragment: str) -> None:
    problem = resource_name_problem(name)
    assert problem is not None and fragment in problem
    with pytest.raises(PresetError, match=fragment):
        renamed(PRESETS["vgpu-manager"], names={"memory": name})


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"domain": "Inspur.com"}, "domain 'Inspur.com' is not a DNS subdomain"),
    ({"names": {"memory": ""}}, "has no domain"),  # only the optional names may go
    ({"names": {"gpus": "a.io/b"}}, "no such names to rename: gpus"),
    ({"names": {"number": "a.io/x", "cores": "a.io/x"}}, "a.io/x names two of its resources"),
])
def test_bad_renames_say_why(kwargs: dict, fragment: str) -> None:
    with pytest.raises(PresetError, match=fragment):
        renamed(PRESETS["hami"], **kwargs)


def test_tke_has_only_its_two_names() -> None:
    with pytest.raises(PresetError, match="there is no resourceCores"):
        renamed(PRESETS["tke"], names={"cores": "inspur.com/c"},
                labels={"cores": "resourceCores"})
    assert renamed(PRESETS["tke"], names={"number": "a.io/core"}).memory == (
        "tencent.com/vcuda-memory")


def test_enabled_presets_must_not_share_a_name_or_sit_under_a_mig_prefix() -> None:
    check_presets([PRESETS["vgpu-manager"], HAMI, INSPUR, PRESETS["volcano"]])
    clash = renamed(PRESETS["hami"], names={"memory": "nvidia.com/vgpu-memory"})
    with pytest.raises(PresetError, match=re.escape(
            "nvidia.com/vgpu-memory is a name of both vgpu-manager and hami")):
        check_presets([PRESETS["vgpu-manager"], clash])
    mig = renamed(PRESETS["volcano"], names={"number": "nvidia.com/mig-vgpu"})
    with pytest.raises(PresetError, match="would be read as a MIG instance"):
        check_presets([PRESETS["hami"], mig])


def test_defaults_carry_the_renamed_presets_to_the_parser() -> None:
    d = Defaults(preset="tke", compat_presets=("hami",), presets=(INSPUR, HAMI))
    assert enabled_presets(d) == [INSPUR, HAMI]
    # seed 004's pod
    (c,) = parse_pod(limits({"inspur.com/vcuda-core": 50, "inspur.com/vcuda-memory": 30}),
                     d).containers
    assert (c.number, c.memory, c.cores) == (1, 30 * 256, 50)
    (c,) = parse_pod(limits({"example.com/vgpu": 2, "example.com/vgpu-memory-share": 40}),
                     d).containers
    assert (c.number, c.memory_percent) == (2, 40)
    # the names the settings replaced are no GPU names any more
    for old in ({"tencent.com/vcuda-core": 50}, {"nvidia.com/gpu": 1},
                {"nvidia.com/gpumem": 100}):
        assert not parse_pod(limits(old), d).wants_gpu


def test_errors_name_the_renamed_resources() -> None:
    d = Defaults(preset="tke", presets=(INSPUR,))
    with pytest.raises(RequestError, match=re.escape(
            "inspur.com/vcuda-memory needs inspur.com/vcuda-core")):
        parse_pod(limits({"inspur.com/vcuda-memory": 3}), d)
    with pytest.raises(RequestError,
                       match=re.escape("inspur.com/vcuda-core: 150 must be below 100")):
        parse_pod(limits({"inspur.com/vcuda-core": 150}), d)
    d = Defaults(preset="hami", presets=(HAMI,))
    with pytest.raises(RequestError, match=re.escape(
            "give either example.com/vgpu-memory or example.com/vgpu-memory-share")):
        parse_pod(limits({"example.com/vgpu-memory": 1,
                          "example.com/vgpu-memory-share": 5}), d)


def test_admission_mutates_and_admits_under_the_renamed_names() -> None:
    volcano = renamed(PRESETS["volcano"], domain="gpu.example.org")
    d = Defaults(preset="volcano", presets=(volcano,))
    share = limits({"gpu.example.org/vgpu-memory-percentage": 50})
    assert is_gpu_pod(share, d)
    assert not is_gpu_pod(limits({"volcano.sh/vgpu-memory-percentage": 50}), d)
    ops = mutate(share, AdmissionPolicy(d))
    added = {op["path"]: op["value"] for op in ops}
    assert added["/spec/containers/0/resources/limits/gpu.example.org~1vgpu-number"] == "1"
    verdict, patch = admit(share, AdmissionPolicy(d))
    assert verdict.allowed and patch == ops
