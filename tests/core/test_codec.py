import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz import examples
from vgpud.core.codec import (
    CodecError,
    decode_assignment,
    decode_node_devices,
    encode_assignment,
    encode_node_devices,
)
from vgpud.core.model import (
    ComputePolicy,
    ContainerGrant,
    DeviceGrant,
    Gpu,
    NodeInventory,
    Placement,
)

INV = NodeInventory((Gpu("GPU-a", 0, "NVIDIA A100-SXM4-80GB", 81920, 10, 0, ("GPU-b",)),
                     Gpu("GPU-b", 1, "NVIDIA A100-SXM4-80GB", 81920, 10, 1, ("GPU-a",),
                         healthy=False)), 1.5, 2.0)
PLACEMENT = Placement("gpu-node-1", (
    ContainerGrant("init", True, (DeviceGrant("GPU-a", 1000, 10),)),
    ContainerGrant("main", False, (DeviceGrant("GPU-a", 3000, 30), DeviceGrant("GPU-b", 3000, 30))),
), ComputePolicy.BALANCE, 3, "2026-11-21T10:00:00Z")


def test_round_trips() -> None:
    assert decode_node_devices(encode_node_devices(INV)) == INV
    assert decode_assignment(encode_assignment(PLACEMENT)) == PLACEMENT


def test_design_example_decodes_and_unknown_fields_are_ignored() -> None:
    doc = {"v": 1, "memoryScaling": 1.0, "coreScaling": 1.0, "future": {"x": 1},
           "devices": [{"uuid": "GPU-1", "index": 0, "model": "NVIDIA A100-SXM4-80GB",
                        "memory": 81920, "split": 10, "numa": 0, "links": [], "healthy": True,
                        "mig": False, "newField": 3}]}
    assert decode_node_devices(json.dumps(doc)).devices[0].memory == 81920
    a = {"v": 1, "node": "n", "time": "t", "containers": [
        {"name": "main", "init": False, "devices": [{"uuid": "GPU-1", "memory": 3000,
                                                     "cores": 30}]}]}
    assert decode_assignment(a).containers[0].devices[0].cores == 30


@pytest.mark.parametrize(("raw", "fragment"), [
    ('{"v": 2, "devices": []}', "unsupported version 2"),
    ('{"devices": []}', "missing version"),
    ("{", "not valid JSON"),
    ("[1]", "expected a JSON object"),
    ('{"v": 1, "devices": [{"uuid": "a", "index": 0, "memory": -5, "split": 1}]}',
     "devices[0].memory"),
    ('{"v": 1, "devices": [{"uuid": "a", "index": 0, "memory": 5, "split": "x"}]}',
     "devices[0].split"),
    ('{"v": 1, "memoryScaling": "NaN", "devices": []}', "memoryScaling"),
    ('{"v": 1, "memoryScaling": -1, "devices": []}', "memoryScaling"),
])
def test_bad_inventories_name_the_field(raw: str, fragment: str) -> None:
    with pytest.raises(CodecError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        decode_node_devices(raw)


@pytest.mark.parametrize("raw", [
    '{"v": 1, "node": "", "containers": []}',
    '{"v": 1, "node": "n", "containers": [{"name": "a", "devices": [{"uuid": "g", "memory": 1, '
    '"cores": 1}, {"uuid": "g", "memory": 1, "cores": 1}]}]}',
    '{"v": 1, "node": "n", "containers": [{"name": "a", "devices": []}, {"name": "a", '
    '"devices": []}]}',
    '{"v": 1, "node": "n", "computePolicy": "turbo", "containers": []}',
    '{"v": 1, "node": "n", "containers": [{"name": "a", "devices": [{"uuid": "g", '
    '"memory": true, "cores": 1}]}]}',
])
def test_bad_assignments(raw: str) -> None:
    with pytest.raises(CodecError):
        decode_assignment(raw)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["v", "node", "devices", "containers", "uuid", "index", "memory",
                         "split", "cores", "name", "init", "links", "numa", "healthy",
                         "memoryScaling", "x"]), inner, max_size=6),
    max_leaves=20)


@pytest.mark.property
@settings(max_examples=examples(400, 5000))
@given(json_values, st.booleans())
def test_codecs_raise_only_their_own_error(value: object, as_text: bool) -> None:
    """Any other exception fails the test; a CodecError says what was wrong."""
    raw = json.dumps(value) if as_text else value
    for decode in (decode_node_devices, decode_assignment):
        try:
            decode(raw)  # type: ignore[arg-type]
        except CodecError as e:
            assert str(e).strip(), f"{decode.__name__} raised a CodecError without a reason"


@pytest.mark.property
@settings(max_examples=examples(200, 5000))
@given(st.binary(max_size=64) | st.text(max_size=64))
def test_codecs_on_random_bytes(raw: bytes | str) -> None:
    for decode in (decode_node_devices, decode_assignment):
        with pytest.raises(CodecError):
            decode(raw)
