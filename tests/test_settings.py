"""The user's settings: every value out of range is an error that names the variable and its range."""

from __future__ import annotations

import pytest

from tilefuse.runtime import _env


@pytest.mark.parametrize("name", ["TILEFUSE_HOST_TIMEOUT", "TILEFUSE_WAIT_TIMEOUT"])
def test_timeouts_take_finite_positive_seconds_up_to_a_day(monkeypatch, name):
    monkeypatch.delenv(name, raising=False)
    assert _env.seconds(name, 7.0) == 7.0
    monkeypatch.setenv(name, " 2.5 ")
    assert _env.seconds(name, 7.0) == 2.5
    monkeypatch.setenv(name, "86400")
    assert _env.seconds(name, 7.0) == 86400.0
    monkeypatch.setenv(name, "0.01")
    assert _env.seconds(name, 7.0) == 0.01
    for bad in ("soon", "0", "-1", "nan", "inf", "-inf", "1e10", "86401", "1e-12", "0.001"):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ValueError, match=rf"{name}='{bad}': expected a number of seconds in \[0.01, 86400\]"):
            _env.seconds(name, 7.0)


def test_set_wait_timeout_takes_the_same_range():
    import tilefuse

    for bad in (0, 1e-12, float("inf"), float("nan"), 1e10, "soon"):
        with pytest.raises(ValueError, match=r"set_wait_timeout: seconds=.*\[0.01, 86400\]"):
            tilefuse.runtime.world.set_wait_timeout(bad)


def test_wait_and_host_timeouts_read_their_own_variables(monkeypatch):
    monkeypatch.setenv("TILEFUSE_WAIT_TIMEOUT", "3")
    monkeypatch.setenv("TILEFUSE_HOST_TIMEOUT", "4")
    assert (_env.wait_timeout(30.0), _env.host_timeout()) == (3.0, 4.0)
    monkeypatch.delenv("TILEFUSE_WAIT_TIMEOUT")
    monkeypatch.delenv("TILEFUSE_HOST_TIMEOUT")
    assert (_env.wait_timeout(30.0), _env.host_timeout()) == (30.0, _env.DEFAULT_HOST_TIMEOUT_S)


def test_heap_size_takes_bytes_or_a_unit(monkeypatch):
    monkeypatch.delenv("TILEFUSE_HEAP_SIZE", raising=False)
    assert _env.heap_size() is None
    for text, value in (("4096", 4096), ("3M", 3 << 20), ("1.5g", 3 << 29), ("1T", 1 << 40)):
        monkeypatch.setenv("TILEFUSE_HEAP_SIZE", text)
        assert _env.heap_size() == value, text
    for bad in ("lots", "4GB", "nan", "inf", "0", "-1M", "2T", "1e30", "1e-12", "-inf"):
        monkeypatch.setenv("TILEFUSE_HEAP_SIZE", bad)
        with pytest.raises(ValueError, match=r"TILEFUSE_HEAP_SIZE=.*K/M/G/T.*at most 1T"):
            _env.heap_size()


def test_switches_take_on_or_off(monkeypatch):
    monkeypatch.delenv("TILEFUSE_SYNC_ERRORS", raising=False)
    assert _env.sync_errors() is False
    for text, value in (("1", True), ("on", True), ("TRUE", True), ("0", False), ("off", False), ("no", False)):
        monkeypatch.setenv("TILEFUSE_SYNC_ERRORS", text)
        assert _env.sync_errors() is value, text
    for bad in ("2", "maybe", "nan"):
        monkeypatch.setenv("TILEFUSE_SYNC_ERRORS", bad)
        with pytest.raises(ValueError, match=r"TILEFUSE_SYNC_ERRORS=.*1 \(on\) or 0 \(off\)"):
            _env.sync_errors()


def test_autotune_mode_and_backend(monkeypatch):
    for text, mode in (("", "auto"), ("auto", "auto"), ("1", "1"), ("on", "1"), ("0", "0"), ("off", "0")):
        monkeypatch.setenv("TILEFUSE_AUTOTUNE", text)
        assert _env.autotune_mode() == mode, text
    monkeypatch.setenv("TILEFUSE_AUTOTUNE", "sometimes")
    with pytest.raises(ValueError, match="TILEFUSE_AUTOTUNE='sometimes': use 0"):
        _env.autotune_mode()
    monkeypatch.setenv("TILEFUSE_BACKEND", "tpu")
    with pytest.raises(ValueError, match=r"TILEFUSE_BACKEND='tpu': expected one of \('cuda', 'cpu'\)"):
        _env.requested_backend()
