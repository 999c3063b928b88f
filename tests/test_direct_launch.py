"""Replayed launches made directly (``launcher.DirectLaunch``: one ``cuLaunchKernel`` on a parameter
buffer packed once): the buffer is the one Triton's launcher would pass, checked against the
parameters a compiled kernel declares, and on a GPU every op x variant replays through it with the
results of Triton's launcher, bit for bit.

    python tests/test_direct_launch.py     # the compile step on its own (no interpreter)
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import pytest
import torch

from tilefuse.runtime import launcher

_PTR = ".u64 .ptr .global .align 1"


def _ptx(name: str, params: list) -> str:
    """A PTX entry as Triton 3.6 / 3.7 writes one, with parameters of the given PTX types."""
    decls = ",\n".join(f"\t.param {ty} {name}_param_{i}" for i, ty in enumerate(params))
    return f".visible .entry {name}(\n{decls}\n)\n.maxntid 128, 1, 1\n{{\n"


# pointers, i32, i64, i1, fp32, then the two scratch pointers
_PTX = _ptx("k", [_PTR, ".u32", ".u64", ".u8", ".f32", _PTR, _PTR])
_SIG = {"x": "*bf16", "n": "i32", "seq": "i64", "flag": "i1", "one": "constexpr", "scale": "fp32",
        "BLOCK": "constexpr"}


def test_layout_follows_the_signature_and_the_declared_parameters():
    sizes = launcher.ptx_params(_PTX, "k")
    assert sizes == [8, 4, 8, 1, 4, 8, 8]
    layout, why = launcher.param_layout(_SIG, sizes)
    assert why == ""
    assert [i for i, _ in layout] == [0, 1, 2, 3, 5, launcher.GLOBAL_SCRATCH, launcher.PROFILE_SCRATCH]
    assert [c for _, c in layout] == [ctypes.c_uint64, ctypes.c_int32, ctypes.c_int64, ctypes.c_int8,
                                      ctypes.c_float, ctypes.c_uint64, ctypes.c_uint64]
    # a 128-byte by-value parameter (a TMA descriptor) is read as its size
    grid_constant = _PTX.replace(".param .u64 k_param_2", ".param .align 64 .b8 k_param_2[128]")
    assert launcher.ptx_params(grid_constant, "k")[2] == 128


@pytest.mark.parametrize("change, says", [
    ({"n": "i64"}, "where the kernel declares"),  # the buffer would not be the kernel's
    ({"scale": "fp16"}, "type fp16"),  # no fp16 scalars
    ({"x": ("*bf16", "*bf16")}, "tuple"),
])
def test_layout_refuses_what_it_cannot_pack(change, says):
    layout, why = launcher.param_layout({**_SIG, **change}, launcher.ptx_params(_PTX, "k"))
    assert layout == [] and says in why, why
    assert launcher.param_layout(_SIG, None)[1] == "no PTX entry"
    assert launcher.ptx_params(_PTX, "other") is None


def test_driver_constants_are_cuda_h_s():
    """The enum values the direct path hands the driver, against the CUDA header Triton ships."""
    import re

    import triton

    header = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "include", "cuda.h")
    if not os.path.exists(header):
        pytest.skip("no cuda.h in this Triton")
    text = open(header).read()
    for name, value in (("CU_POINTER_ATTRIBUTE_DEVICE_POINTER", launcher._CU_POINTER_ATTRIBUTE_DEVICE_POINTER),
                        ("CUDA_ERROR_INVALID_CONTEXT", launcher._CUDA_ERROR_INVALID_CONTEXT)):
        found = re.search(rf"\b{name}\s*=\s*(\d+)", text)
        assert found and int(found.group(1)) == value, (name, value)


def test_direct_launches_need_a_compiled_kernel(monkeypatch):
    """Anything but a compiled Triton kernel (the stand-ins of the launcher tests) stays on Triton's path."""
    monkeypatch.setattr(launcher, "_driver", lambda: (None, None, None))
    direct, why = launcher.direct_launch(object(), [])
    assert direct is None and why


def _kernel(x_ptr, ws_ptr, n, seq, flag, scale, BLOCK: constexpr):  # noqa: F821
    pass


_KERNEL_SIG = {"x_ptr": "*fp32", "ws_ptr": "*fp32", "n": "i32", "seq": "i64", "flag": "i1", "scale": "fp32",
               "BLOCK": "constexpr"}
_KERNEL_PTX = _ptx("_kernel", [_PTR, _PTR, ".u32", ".u64", ".u8", ".f32", _PTR, _PTR])


def test_a_plan_replays_its_launch_directly_with_the_new_calls_pointers(monkeypatch):
    """The recorded launch becomes a direct one: the buffer holds the constants' addresses and the
    scalars as recorded and, at each replay, the new call's own pointer; switched off, the replay goes
    through Triton's launcher. A stand-in driver reads the buffer as the kernel would."""
    import types

    from test_launcher import _jit_stand_in, _record

    from tilefuse.runtime import plans
    from tilefuse.runtime.launcher import FastKernel

    log, launches = [], []
    jit = _jit_stand_in(_kernel, log)
    compiled = jit[(1,)]()
    compiled.metadata = types.SimpleNamespace(name="_kernel", num_warps=4, shared=1024, num_ctas=1,
                                              launch_cooperative_grid=False, launch_pdl=False,
                                              profile_scratch_size=0, global_scratch_size=0, global_scratch_align=1)
    compiled.function = 0xF00
    compiled.src = types.SimpleNamespace(signature=_KERNEL_SIG)
    compiled.asm = {"ptx": _KERNEL_PTX}
    log.clear()
    kinds = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int32, ctypes.c_int64, ctypes.c_int8, ctypes.c_float,
             ctypes.c_uint64, ctypes.c_uint64]

    def fake_launch(function, g0, g1, g2, bx, by, bz, shared, stream, params_at, extra):
        cells = (ctypes.c_void_p * len(kinds)).from_address(params_at)
        launches.append(((function, g0, g1, g2, bx, shared, stream),
                         [kind.from_address(cells[i]).value for i, kind in enumerate(kinds)]))
        return 0

    monkeypatch.setattr(launcher, "_driver", lambda: (fake_launch, None, None))
    monkeypatch.setattr(launcher, "direct_available", lambda: True)
    monkeypatch.setattr(launcher, "_current_stream", lambda: 7)
    monkeypatch.setattr(plans, "_device_memory", lambda v: isinstance(v, torch.Tensor))
    monkeypatch.setattr(plans, "_device_address", lambda t: t.data_ptr())
    k = FastKernel(jit, do_not_specialize=["seq"])
    k._fast = True
    ws = torch.zeros(8)

    def call(a):
        c = torch.empty(a.shape)
        k[(3,)](c, ws, a.shape[0], 1234567890123, True, 0.5, BLOCK=16)
        return c

    k[(3,)](torch.zeros(5), ws, 5, 1234567890123, True, 0.5, BLOCK=16)  # compiles the signature first
    rec, c0 = _record(call, [torch.randn(5)])
    assert rec.failure is None, rec.failure
    before = dict(plans.STATS)
    plan = rec.plan(c0)
    assert plans.STATS["direct"] == before["direct"] + 1, plans.LAST_NOT_DIRECT[0]
    log.clear()
    c1 = plan.run([torch.randn(5)], plans.Replay(None, 7, False))
    c2 = plan.run([torch.randn(5)], plans.Replay(None, 7, False))
    assert log == [] and len(launches) == 2
    (fn, g0, g1, g2, bx, shared, stream), values = launches[0]
    assert (fn, g0, g1, g2, bx, shared, stream) == (0xF00, 3, 1, 1, 128, 1024, 7)
    assert values[0] == c1.data_ptr() != c0.data_ptr() and values[1] == ws.data_ptr()
    assert values[2:6] == [5, 1234567890123, 1, 0.5] and values[6:] == [0, 0]
    assert launches[1][1][0] == c2.data_ptr() and launches[1][1][1:] == values[1:]
    old = launcher.set_direct_launches(False)
    try:
        c3 = plan.run([torch.randn(5)], plans.Replay(None, 7, False))
    finally:
        launcher.set_direct_launches(old)
    assert len(launches) == 2 and log[0][0] == "fast" and log[0][2][0] == c3.data_ptr()


def _compile_sample() -> dict:
    """Compiles a kernel with every kind of argument the ops pass for sm_90 (no GPU needed) and
    returns its signature, name and PTX parameter sizes."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def sample(x_ptr, y_ptr, flags_ptr, n, seq, flag, one, scale, BLOCK: tl.constexpr, SUB: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        v = tl.load(x_ptr + offs, mask=offs < n).to(tl.float32)
        if flag:
            v = v * scale + one
        tl.atomic_xchg(flags_ptr, seq, sem="release", scope="sys")
        desc = tl.make_tensor_descriptor(y_ptr, shape=[n], strides=[1], block_shape=[BLOCK])
        desc.store([0], (v + SUB).to(y_ptr.dtype.element_ty))

    sig = {"x_ptr": "*bf16", "y_ptr": "*bf16", "flags_ptr": "*i64", "n": "i32", "seq": "i64", "flag": "i1",
           "one": "constexpr", "scale": "fp32", "BLOCK": "constexpr", "SUB": "constexpr"}
    compiled = triton.compile(ASTSource(sample, sig, {"one": 1, "BLOCK": 128, "SUB": 2}),
                              target=GPUTarget("cuda", 90, 32))
    return {"signature": compiled.src.signature, "name": compiled.metadata.name,
            "sizes": launcher.ptx_params(compiled.asm["ptx"], compiled.metadata.name),
            "scratch": compiled.metadata.global_scratch_size}


def test_layout_matches_a_kernel_compiled_for_hopper():
    try:
        from triton.backends import backends

        if "nvidia" not in backends:
            pytest.skip("Triton has no NVIDIA backend here")
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"Triton's backends do not load: {e}")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TRITON_INTERPRET="0", TILEFUSE_BACKEND="cuda",
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, os.path.abspath(__file__)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    layout, why = launcher.param_layout(got["signature"], got["sizes"])
    assert why == "", why
    # the constexprs (the declared ones and the 1 Triton specialised) are not parameters; the scratch
    # the descriptor needs is the first trailing pointer
    assert [i for i, _ in layout][:-2] == [0, 1, 2, 3, 4, 5, 7]
    assert got["scratch"] > 0


# -- on a GPU ---------------------------------------------------------------------------------------

OPS = ("gemm_all_scatter", "all_gather_gemm", "gemm_reduce_scatter", "gemm_all_reduce")
VARIANTS = ("bulk_sync", "producer_consumer", "fused_sequential", "wg_specialized")


def job_direct_replays(ctx, calls):
    """Every op x variant: ``calls`` calls (the third on replay their plan), each checked against the
    reference, then the last operands again through Triton's launcher: the same bits."""
    from ophelpers import assert_matches, poison_workspaces

    import tilefuse
    from tilefuse.ops import registry
    from tilefuse.runtime import plans

    tilefuse.clear_workspaces()
    report = {}
    for op in OPS:
        for variant in VARIANTS:
            fn, ref = registry.get(op, variant), registry.get(op, "reference")
            before = dict(plans.STATS)
            for i in range(calls):
                g = torch.Generator().manual_seed(900 + i)
                M = 48 * ctx.world if op == "gemm_reduce_scatter" else 48
                a = torch.randn(M, 64, generator=g)
                a = (a if op == "gemm_all_scatter" else a + ctx.rank).to(ctx.device, torch.bfloat16)
                b = (torch.randn(64, 80, generator=g) + ctx.rank).to(ctx.device, torch.bfloat16)
                poison_workspaces()
                got = fn(a, b).clone()
                assert_matches(got, ref(a, b), torch.bfloat16, 64, ctx.on_gpu, f"{op}/{variant} call {i}",
                               scale=ctx.world)
            launcher.set_direct_launches(False)
            try:
                poison_workspaces()
                again = fn(a, b).clone()
            finally:
                launcher.set_direct_launches(True)
            tilefuse.synchronize()
            report[(op, variant)] = (plans.STATS["direct"] - before["direct"],
                                     plans.STATS["not_direct"] - before["not_direct"],
                                     plans.LAST_NOT_DIRECT[0], bool(torch.equal(got, again)))
    if torch.cuda.current_device() == 0:  # (a fresh thread starts on GPU 0)
        # A replay from a thread that never touched the GPU: the same plan, the same bits.
        import threading

        box = []
        thread = threading.Thread(target=lambda: box.append(fn(a, b).clone()))
        thread.start()
        thread.join()
        tilefuse.synchronize()
        report[("from a fresh thread", f"{op}/{variant}")] = (1, 0, "", bool(box) and bool(torch.equal(box[0], again)))
    return report


def test_every_op_replays_through_direct_launches(pools, on_gpu):
    if not on_gpu:
        pytest.skip("the interpreter has no compiled launches")
    for report in pools.run(2, job_direct_replays, 4, timeout=900):
        for (op, variant), (direct, not_direct, why, same) in report.items():
            assert direct >= 1 and not_direct == 0, (op, variant, direct, not_direct, why)
            assert same, f"{op}/{variant}: Triton's launcher gave other bits"


if __name__ == "__main__":
    print(json.dumps(_compile_sample()))
