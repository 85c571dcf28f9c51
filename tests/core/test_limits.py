"""The limits file: ``parse`` is the exact inverse of ``render`` (issue 8)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz import examples
from vgpud.core.limits import (
    MIB,
    DeviceLimits,
    GrantError,
    Limits,
    LimitsError,
    limits_for,
    parse,
    render,
)
from vgpud.core.model import ComputePolicy, ContainerGrant, DeviceGrant, Gpu, NodeInventory

# what a value in the file may hold: printable ASCII, no '#', no spaces at the ends
words = st.text(st.characters(min_codepoint=32, max_codepoint=126, exclude_characters="#"),
                min_size=1, max_size=24).filter(lambda w: w == w.strip(" "))
device_limits = st.integers(0, (1 << 64) - 1).flatmap(lambda mem: st.builds(
    DeviceLimits, uuid=words, memory_limit=st.just(mem), core_limit=st.integers(0, 100),
    core_policy=st.sampled_from(ComputePolicy), oversubscribe=st.booleans(),
    spill_limit=st.integers(0, mem)))
maybe_word = st.one_of(st.just(""), words)
limits = st.builds(Limits, devices=st.lists(device_limits, max_size=16).map(tuple),
                   priority=st.integers(-1000, 1000), state_dir=maybe_word,
                   register=maybe_word, container=maybe_word)


@pytest.mark.property
@settings(max_examples=examples(300, 5000))
@given(limits)
def test_parse_is_the_exact_inverse_of_render(x: Limits) -> None:
    assert parse(render(x)) == x


def test_no_limit_and_a_whole_gpu_survive_the_round_trip() -> None:
    """Once, ``core_limit=0`` meant both "no cores asked" and "100 % or more", and a
    restarted plugin read both back as 100."""
    inv = NodeInventory((Gpu("GPU-a", 0, "m", 16000), Gpu("GPU-b", 1, "m", 16000)),
                        memory_scaling=1.5)
    grant = ContainerGrant("main", False, (DeviceGrant("GPU-b", 3000, 100),
                                           DeviceGrant("GPU-a", 0, 0)))
    got = parse(render(limits_for(grant, inv, compute_policy=ComputePolicy.BALANCE,
                                  priority=-3, state_dir="/var/run/vgpud")))
    assert got.visible_uuids == ("GPU-a", "GPU-b")  # CUDA order: the node's index order
    assert [(d.memory_limit, d.core_limit) for d in got.devices] == [(0, 0), (3000 * MIB, 100)]
    assert all(d.oversubscribe and d.core_policy is ComputePolicy.BALANCE for d in got.devices)
    # scaling 1.5: a third of the grant may spill, two thirds must be device memory
    assert [d.spill_limit for d in got.devices] == [0, 1000 * MIB]
    assert (got.priority, got.state_dir, got.container) == (-3, "/var/run/vgpud", "main")


def test_a_grant_for_a_gpu_the_node_lacks_is_refused() -> None:
    grant = ContainerGrant("main", False, (DeviceGrant("GPU-x", 1, 1),))
    with pytest.raises(GrantError, match="GPU-x"):
        limits_for(grant, NodeInventory(()), compute_policy=ComputePolicy.FIXED, priority=0,
                   state_dir="/s")


@pytest.mark.parametrize(("x", "why"), [
    (Limits((DeviceLimits("GPU-a#b", 1, 1),)), "cannot be written"),
    (Limits((DeviceLimits("", 1, 1),)), "must not be empty"),
    (Limits((DeviceLimits("GPU-a", -1, 1),)), "negative"),
    (Limits((DeviceLimits("GPU-a", 1, 101),)), "0-100"),
    (Limits((DeviceLimits("GPU-a", 1, 1, spill_limit=2),)), "spill_limit"),
    (Limits((), priority=5000), "±1000"),
    (Limits((), state_dir="/a\nversion=2"), "cannot be written"),
    (Limits((), container="ü"), "printable ASCII"),
    (Limits(tuple(DeviceLimits(f"GPU-{i}", 1, 1) for i in range(17))), "at most 16"),
])
def test_render_refuses_what_the_file_cannot_hold(x: Limits, why: str) -> None:
    with pytest.raises(LimitsError, match=why):
        render(x)


@pytest.mark.parametrize(("text", "why"), [
    ("", "no version"),
    ("version=2\n", "not supported"),
    ("version=1\nnonsense\n", "line 2: expected key=value"),
    ("version=1\ndevice.x.uuid=a\n", "bad device index"),
    ("version=1\ndevice.1.uuid=a\ndevice.1.memory_limit=1\n", "numbered"),
    ("version=1\ndevice.0.uuid=a\n", "memory_limit are required"),
    ("version=1\ndevice.0.uuid=a\ndevice.0.memory_limit=1\ndevice.0.core_limit=200\n",
     "outside 0..100"),
    ("version=1\ndevice.0.uuid=a\ndevice.0.memory_limit=1\ndevice.0.core_policy=max\n",
     "core_policy"),
    ("version=1\ndevice.0.uuid=a\ndevice.0.memory_limit=1\ndevice.0.oversubscribe=yes\n",
     "oversubscribe"),
    ("version=1\npriority=x\n", "not a whole number"),
])
def test_parse_names_what_is_wrong(text: str, why: str) -> None:
    with pytest.raises(LimitsError, match=why):
        parse(text)


def test_parse_ignores_comments_and_unknown_keys() -> None:
    text = "# written by hand\nversion=1  # the only version\nfuture_key=1\n" \
           "device.0.uuid = GPU-a\ndevice.0.memory_limit=5\ndevice.0.future=x\n"
    assert parse(text) == Limits((DeviceLimits("GPU-a", 5, 0),))
