"""A warp-specialized config really compiles warp-specialized for Hopper (sm_90).

Triton's Hopper warp specialization gives up without a word on a kernel that holds an ``if`` with an
``else`` branch anywhere (after inlining), and the kernel then runs the specialized launch shape (4
warps for a 128x256 tile) unspecialized. A kernel that begins its collective call, or passes the
closing barrier, has such branches (``launch.GemmCall.kernel_may_begin``). This test runs every
variant that honours ``Config.WARP_SPEC`` with a warp-specialized 128x256 config on one rank,
records each launch of a kernel taking ``WARP_SPEC`` as it would be made on a GPU (warp
specialization forced on in ``gemm.warp_specialized``), then compiles those launches for sm_90 in a
process without the interpreter (Triton's CUDA backend needs no GPU to compile) and checks the TTGIR
for the specialized loop.

    python tests/test_warp_spec_compile.py launches.json   # the compile step on its own
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

WS = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4, WARP_SPEC=1)
# (op, variant, kwargs): every variant in config.WARP_SPEC_VARIANTS.
CASES = [
    ("gemm_all_scatter", "bulk_sync", {}),
    ("gemm_all_scatter", "fused_sequential", {}),
    ("all_gather_gemm", "bulk_sync", {}),
    ("gemm_reduce_scatter", "bulk_sync", {}),
    ("gemm_reduce_scatter", "fused_sequential", {}),
    ("gemm_all_reduce", "bulk_sync", {}),
]
_DTYPES = {"bfloat16": "*bf16", "float16": "*fp16", "float32": "*fp32", "int64": "*i64", "int32": "*i32",
           "uint8": "*u8", "int8": "*i8"}


def _describe(value):
    if type(value) is tuple:  # the call tuple, grouped strides
        return ["tuple", [_describe(v) for v in value]]
    if hasattr(value, "data_ptr"):
        return ["ptr", str(value.dtype).replace("torch.", "")]
    if isinstance(value, bool):
        return ["bool", value]
    if isinstance(value, int):
        return ["int", value]
    if isinstance(value, float):
        return ["float", value]
    return ["other", repr(value)]


def _arg_type(kind, value):
    """The signature type of an argument :func:`_describe` described (a tuple's: a tuple of types)."""
    if kind == "tuple":
        return tuple(_arg_type(*v) for v in value)
    if kind == "ptr":
        return _DTYPES[value]
    if kind == "int":
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    return "i1" if kind == "bool" else "fp32"


def job_record_launches(ctx):
    """Run CASES with the warp-specialized config; returns, per case, the launches of kernels that take
    WARP_SPEC: ``(case, module, kernel, [[name, kind, value], ...], options)``."""
    import tilefuse
    import tilefuse.ops.gemm_all_reduce  # noqa: F401  (registers the op)
    from tilefuse.ops import registry
    from tilefuse.ops.common import gemm
    from tilefuse.ops.common.config import Config
    from tilefuse.runtime import launcher

    def as_on_hopper(config, use_tma, device):  # the device-independent part of warp_specialized
        return bool(config.WARP_SPEC) and use_tma and config.SPLIT_K == 1

    records, case_now = [], [None]
    saved_getitem, saved_ws = launcher.FastKernel.__getitem__, gemm.warp_specialized

    def getitem(self, grid):
        inner = saved_getitem(self, grid)

        def launch(*args, **kwargs):
            bound = self._bind(args, kwargs)
            values = None if bound is None else bound[0]
            if "WARP_SPEC" in self._index and values is not None and values[self._index["WARP_SPEC"]]:
                fn = self.jit_fn.fn
                records.append((case_now[0], fn.__module__, fn.__name__,
                                [[n, *_describe(v)] for n, v in zip(self._names, values)],
                                {k: v for k, v in kwargs.items() if k not in self._index}))
            return inner(*args, **kwargs)
        return launch

    launcher.FastKernel.__getitem__ = getitem
    gemm.warp_specialized = as_on_hopper
    try:
        cfg = Config(GEMM_SMS=4, COMM_SMS=0, **WS)
        for op, variant, kwargs in CASES:
            case_now[0] = f"{op}.{variant}"
            M, N, K = 256, 256, 64
            a = torch.randn(M, K, dtype=torch.float16, device=ctx.device)  # fp16: the interpreter's bf16 is wrong
            b = torch.randn(K, N, dtype=torch.float16, device=ctx.device)
            got = registry.get(op, variant)(a, b, config=cfg, **kwargs)
            tilefuse.synchronize()
            ref = registry.get(op, "reference")(a, b)
            assert torch.allclose(got.float(), ref.float(), rtol=2e-2, atol=2e-1), case_now[0]
    finally:
        launcher.FastKernel.__getitem__ = saved_getitem
        gemm.warp_specialized = saved_ws
    return records


def _ttgir(src, target, options: dict) -> str:
    """The TTGIR of ``src`` for ``target``: Triton's pipeline up to that stage only (the LLVM and ptxas
    stages, most of a compile, decide nothing here); the whole ``triton.compile`` where this Triton's
    internals differ from 3.6's and 3.7's."""
    import triton
    from triton._C.libtriton import ir
    from triton.compiler.compiler import make_backend

    try:
        backend = make_backend(target)
        opts = backend.parse_options(dict(options, **src.parse_options()))
        stages: dict = {}
        backend.add_stages(stages, opts, src.language)
        context = ir.context()
        ir.load_dialects(context)
        backend.load_dialects(context)
        module = src.make_ir(target, opts, backend.get_codegen_implementation(opts), backend.get_module_map(),
                             context)
        metadata = {"hash": "0", "target": target, **opts.__dict__}
        for ext in ("ttir", "ttgir"):
            module = stages[ext](module, metadata)
        return str(module)
    except (AttributeError, KeyError, TypeError, ImportError):
        return triton.compile(src, target=target, options=options).asm["ttgir"]


def compile_for_hopper(record) -> tuple[bool, str]:
    """Compile one recorded launch for sm_90 up to TTGIR; returns (the loop was warp-specialized, the
    kernel's warps outside any specialized partition)."""
    import importlib
    import re

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    _, module, name, args, options = record
    jit = getattr(importlib.import_module(module), name).jit_fn
    signature, constants = {}, {}
    for (arg, kind, value), param in zip(args, jit.params):
        if param.is_constexpr:
            signature[arg], constants[arg] = "constexpr", value
        else:
            signature[arg] = _arg_type(kind, value)
    ttgir = _ttgir(ASTSource(jit, signature, constants), GPUTarget("cuda", 90, 32), options)
    warps = re.search(r'"ttg.num-warps" = (\d+)', ttgir)
    return "ttg.warp_specialize" in ttgir, f"ttg.num-warps {warps.group(1) if warps else '?'}"


def _hopper_compiler() -> str:
    """'' where Triton can compile for sm_90 here, else why not."""
    try:
        from triton.backends import backends

        if "nvidia" not in backends:
            return "Triton has no NVIDIA backend here"
    except Exception as e:  # noqa: BLE001
        return f"Triton's backends do not load: {e}"
    return ""


@pytest.mark.slow
def test_warp_specialized_configs_compile_specialized(pools, tmp_path):
    why = _hopper_compiler()
    if why:
        pytest.skip(why)
    records = pools.run(1, job_record_launches)[0]
    cases = {r[0] for r in records}
    expected = {f"{op}.{v}" for op, v, kw in CASES}
    assert cases == expected, f"no warp-specialized launch recorded for {sorted(expected - cases)}"
    path = tmp_path / "launches.json"
    path.write_text(json.dumps(records))
    env = dict(os.environ, TRITON_INTERPRET="0", TILEFUSE_BACKEND="cuda")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, os.path.abspath(__file__), str(path)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    print(done.stdout)  # one line per kernel (pytest -s)
    verdicts = json.loads(done.stdout.strip().splitlines()[-1])
    unspecialized = [v for v in verdicts if not v[1]]
    assert not unspecialized, f"compiled unspecialized for sm_90: {unspecialized}"


def main(path: str) -> None:
    records = json.loads(open(path).read())
    seen, verdicts = set(), []
    for record in records:
        key = json.dumps(record[1:])
        if key in seen:
            continue
        seen.add(key)
        ok, summary = compile_for_hopper(record)
        verdicts.append([f"{record[0]}: {record[2]}", ok, summary])
        print(f"{record[0]} {record[2]}: {'specialized' if ok else 'NOT specialized'} ({summary})", flush=True)
    print(json.dumps(verdicts))


if __name__ == "__main__":
    main(sys.argv[1])
