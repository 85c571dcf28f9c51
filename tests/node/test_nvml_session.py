"""The NVML session's order of things, with NVML's init and shutdown recorded instead of
called: a re-initialisation waits for the NVML calls under way, goes before the calls
that arrive while it waits, releases what the old session owns before shutting it down,
and runs its discovery before anyone else sees the new session."""

from __future__ import annotations

import threading
import time

import pynvml
import pytest

from vgpud.node.nvml import NvmlSession


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    log: list[str] = []
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: log.append("init"))
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: log.append("shutdown"))
    return log


def test_a_renewal_ends_the_session_after_releasing_what_it_owns(calls: list[str]) -> None:
    s = NvmlSession()
    with pytest.raises(pynvml.NVMLError) as e, s.shared():
        pass
    assert e.value.value == pynvml.NVML_ERROR_UNINITIALIZED  # no session yet
    def discover() -> int:
        calls.append("discover")
        return 7

    assert s.renew(discover) == 7
    with s.shared() as generation:
        first = generation
        key = s.own(lambda: calls.append("free set"))
        s.own(lambda: calls.append("free other"))
    s.renew(discover)
    assert calls == ["init", "discover", "free set", "free other", "shutdown", "init",
                     "discover"]
    with s.shared() as generation:
        assert generation != first
    assert s.disown(key) is None  # released with its session
    s.close()
    assert calls[-1] == "shutdown" and s.generation == 0


def test_a_failed_init_leaves_no_session_and_the_next_renewal_starts_one(
        calls: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    s = NvmlSession()
    s.renew(lambda: None)

    def broken() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.setattr(pynvml, "nvmlInit", broken)
    with pytest.raises(pynvml.NVMLError):
        s.renew(lambda: None)
    with pytest.raises(pynvml.NVMLError), s.shared():
        pass
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: calls.append("init"))
    s.renew(lambda: None)
    assert calls == ["init", "shutdown", "init"]  # no second shutdown: nothing to end


def test_a_renewal_waits_for_holds_and_goes_before_later_ones(calls: list[str]) -> None:
    s = NvmlSession()
    s.renew(lambda: None)
    order: list[str] = []
    held, release = threading.Event(), threading.Event()

    def reader() -> None:
        with s.shared():
            held.set()
            release.wait(5)
            order.append("early reader done")

    def late() -> None:
        with s.shared() as generation:
            order.append(f"late reader in generation {generation}")

    threads = [threading.Thread(target=reader)]
    threads[0].start()
    assert held.wait(5)
    renewal = threading.Thread(target=s.renew, args=(lambda: order.append("discover"),))
    renewal.start()
    time.sleep(0.1)  # the renewal waits for the early reader
    threads.append(threading.Thread(target=late))
    threads[1].start()
    time.sleep(0.1)  # the late reader waits for the renewal
    assert order == [] and calls == ["init"]
    release.set()
    for t in [*threads, renewal]:
        t.join(5)
    assert order == ["early reader done", "discover", "late reader in generation 2"]
    assert calls == ["init", "shutdown", "init"]
