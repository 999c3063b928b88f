"""The fast launch path: arguments bound as Triton binds them, one compiled binary per argument
signature, Triton's own path for a new signature. (On GPUs every op test runs through it; here a
stand-in for a Triton kernel records what would be launched.)"""

import types

import torch

from tilefuse.runtime.launcher import FastKernel


class _Compiled:
    def __init__(self, log):
        self.log = log
        self.function, self.packed_metadata = "fn", "meta"

    def run(self, g0, g1, g2, stream, function, packed, meta, enter, leave, *values):
        self.log.append(("fast", (g0, g1, g2), values))

    def launch_metadata(self, grid, stream, *values):
        return None


def _jit_stand_in(fn, log):
    """What FastKernel reads of a JITFunction: fn, params (with is_constexpr) and [grid](...)."""
    import inspect

    params = [types.SimpleNamespace(is_constexpr=p.annotation == "constexpr")
              for p in inspect.signature(fn).parameters.values()]
    compiled = _Compiled(log)

    class Jit:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                log.append(("triton", grid, args, tuple(sorted(kwargs))))
                return compiled
            return launch

    jit = Jit()
    jit.fn, jit.params = fn, params
    return jit


def _kernel(x_ptr, n, seq, BLOCK: "constexpr", FLAG: "constexpr" = 3):  # noqa: F821
    pass


def test_fast_path_binds_and_caches_by_signature(monkeypatch):
    log = []
    k = FastKernel(_jit_stand_in(_kernel, log), do_not_specialize=["seq"])
    k._fast = True
    from tilefuse.runtime import launcher

    monkeypatch.setattr(launcher, "_current_stream", lambda: 7)
    x = torch.zeros(64)
    k[(4,)](x, 32, 5, BLOCK=16, num_warps=4)  # new signature: Triton's path
    k[(4,)](x, 32, 6, BLOCK=16, num_warps=4)  # same signature (seq is not specialised on): fast path
    k[(2, 3)](x, 48, 7, BLOCK=16, num_warps=4)  # 48 % 16 == 0 like 32: fast path, grid padded
    k[(4,)](x, 33, 8, BLOCK=16, num_warps=4)  # 33 is not a multiple of 16: Triton specialises, new binary
    k[(4,)](x, 32, 9, BLOCK=32, num_warps=4)  # another constexpr value: new binary
    k[(4,)](x, 32, 9, BLOCK=16, num_warps=8)  # another launch option: new binary
    kinds = [entry[0] for entry in log]
    assert kinds == ["triton", "fast", "fast", "triton", "triton", "triton"], kinds
    # The fast path passes every argument in signature order, defaults included (as Triton's binder).
    assert log[1][2] == (x, 32, 6, 16, 3) and log[2][1] == (2, 3, 1)
