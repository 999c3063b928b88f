"""Shared fixtures: rank pools per world size; CPU (interpreter) or GPU chosen by TILEFUSE_TEST_DEVICE."""

import os

from harness import TEST_DEVICE, Pools, install_fixed_order_dot, speed_up_interpreter, start_forkserver

if TEST_DEVICE == "cpu":
    os.environ.setdefault("TILEFUSE_BACKEND", "cpu")
    os.environ["TRITON_INTERPRET"] = "1"
    speed_up_interpreter()  # for the tests that launch kernels in this process
    install_fixed_order_dot()

import pytest  # noqa: E402


def pytest_configure(config):
    # The rank processes' forkserver imports torch and triton while pytest collects.
    if not (config.option.collectonly or config.option.help):
        start_forkserver()


def pytest_report_header(config):
    return f"tilefuse test device: {TEST_DEVICE} (set TILEFUSE_TEST_DEVICE=cuda for GPUs)"


@pytest.fixture(scope="session")
def pools():
    p = Pools()
    yield p
    p.close()


@pytest.fixture(scope="session")
def on_gpu():
    return TEST_DEVICE == "cuda"
