"""A lower-overhead launch of tilefuse's Triton kernels on a GPU.

``kernel[grid](*args, **kwargs)`` through Triton's ``JITFunction.run`` binds and
specialises every argument, hashes a cache key, re-checks the kernel's global constants and builds
launch metadata on every call: tens of microseconds per launch on the H200 host, several launches
per op call. :class:`FastKernel` keeps, per kernel, the compiled binary for each *argument
signature* it has seen (the facts Triton specialises on: dtypes, 16-byte alignment of pointers,
integer widths and divisibility by 16 or equality to 1 where Triton looks at them, the constexpr
values and the launch options) and launches it directly through the compiled kernel's launcher,
with the same arguments Triton would pass. The first launch of a signature goes through Triton as
usual (compiling if needed). In Triton's interpreter every launch goes through Triton.

While a launch plan is being recorded (:mod:`tilefuse.runtime.plans`), launches report to the
recorder, which records each one with its compiled binary and bound argument list. A plan replays
such a launch as a :class:`DirectLaunch` where it can: the kernel's parameter buffer packed once, the
call's own pointers written into it, and one ``cuLaunchKernel`` through ctypes, the call Triton's
launcher ends in, without its per-launch argument parsing and scratch lookup in Python.
``TILEFUSE_TRITON_LAUNCHER=1`` (or :func:`set_direct_launches`) replays through Triton's launcher
instead.
"""

from __future__ import annotations

import ctypes
import functools
import inspect
import os
import re
import threading

from . import _env, plans

_NO_DEFAULT = inspect.Parameter.empty


def _current_stream():
    """The stream Triton would launch on (the current device's current stream)."""
    from triton.runtime.driver import driver

    return driver.active.get_current_stream(driver.active.get_current_device())


class FastKernel:
    """Wraps a ``@triton.jit`` kernel; ``k[grid](...)`` launches as Triton would, faster when the
    argument signature was seen before. Attribute access falls through to the Triton kernel."""

    def __init__(self, jit_fn, do_not_specialize=()):
        self.jit_fn = jit_fn
        sig = inspect.signature(jit_fn.fn if hasattr(jit_fn, "fn") else jit_fn)
        self._names = list(sig.parameters)
        self._defaults = [p.default for p in sig.parameters.values()]
        self._constexpr = [getattr(p, "is_constexpr", False) for p in getattr(jit_fn, "params", [])] or \
            [False] * len(self._names)
        self._dns = {i for i, n in enumerate(self._names) if n in set(do_not_specialize)}
        self._index = {n: i for i, n in enumerate(self._names)}
        self._compiled: dict = {}
        self._fast = not _env.interpreting()

    def __getattr__(self, name):
        return getattr(self.jit_fn, name)

    def __getitem__(self, grid):
        rec = plans._REC
        if rec is not None and rec.thread == threading.get_ident():
            return functools.partial(rec.launch, self, grid)
        if not self._fast:
            return self.jit_fn[grid]
        return functools.partial(self._launch, grid)

    def _launch(self, grid, *args, **kwargs):
        return self._run(grid, args, kwargs)[0]

    def _values(self, args: tuple, kwargs: dict) -> list | None:
        values = list(args) + [_NO_DEFAULT] * (len(self._names) - len(args))
        for name, value in kwargs.items():
            i = self._index.get(name)
            if i is not None:
                values[i] = value
        for i, v in enumerate(values):
            if v is _NO_DEFAULT:
                if self._defaults[i] is _NO_DEFAULT:
                    return None
                values[i] = self._defaults[i]
        return values

    def _signature(self, values: list, kwargs: dict):
        key = []
        for i, v in enumerate(values):
            if self._constexpr[i]:
                key.append(v)
            elif hasattr(v, "data_ptr"):
                key.append((v.dtype, v.data_ptr() & 15 == 0))
            elif isinstance(v, bool):
                key.append(("b", v))
            elif isinstance(v, int):
                width = 32 if -(2**31) <= v < 2**31 else (64 if -(2**63) <= v < 2**63 else 65)
                key.append(("i", width) if i in self._dns else ("i", width, v == 1, v % 16 == 0))
            elif isinstance(v, float):
                key.append("f")
            else:
                key.append(v)  # None, strings: hashed as they are (unhashable -> the Triton path)
        options = tuple(sorted((k, v) for k, v in kwargs.items() if k not in self._index))
        return tuple(key), options

    def _run(self, grid, args: tuple, kwargs: dict) -> tuple:
        """Launch; returns ``(Triton's return value, compiled kernel, bound argument list)``, the last
        two None when the launch went through Triton's own path (which then compiled or found the
        binary: the next launch of the signature is fast)."""
        if not self._fast:
            return self.jit_fn[grid](*args, **kwargs), None, None
        values = self._values(args, kwargs)
        if values is None:
            return self.jit_fn[grid](*args, **kwargs), None, None
        try:
            key = self._signature(values, kwargs)
            compiled = self._compiled.get(key)
        except TypeError:  # an unhashable argument
            return self.jit_fn[grid](*args, **kwargs), None, None
        if compiled is None:
            compiled = self.jit_fn[grid](*args, **kwargs)  # compiles (or finds) the binary, and launches
            if compiled is not None and hasattr(compiled, "run"):
                self._compiled[key] = compiled
                spec = self._index.get("WARP_SPEC")
                if spec is not None and values[spec]:
                    check_specialized(self.jit_fn.fn.__name__, kwargs.get("num_warps", 4), compiled)
            return compiled, None, None
        stream = _current_stream()
        g0 = grid[0]
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        hooks = knobs_runtime()
        enter, leave = hooks.launch_enter_hook, hooks.launch_exit_hook
        if no_hook(enter) and no_hook(leave):  # no profiler listening: no launch metadata to build
            enter = leave = meta = None
        else:
            meta = compiled.launch_metadata(grid, stream, *values)
        compiled.run(g0, g1, g2, stream, compiled.function, compiled.packed_metadata, meta, enter, leave, *values)
        return compiled, compiled, values


def check_specialized(name: str, num_warps: int, compiled) -> bool:
    """Whether a kernel launched with ``WARP_SPEC`` (a warp-specialized tile loop) came out
    specialized: its compiled warps exceed the launch's ``num_warps`` (the partitions' warp groups
    are added). Warns when not: Triton's Hopper pass skips a kernel it cannot specialize without a
    word, and the tile then runs unspecialized on the launch shape meant for the specialized loop
    (4 warps for a 128x256 accumulator: about 6x slower, docs/PERF.md). Called at the first launch of
    each argument signature."""
    got = getattr(getattr(compiled, "metadata", None), "num_warps", None)
    if got is None or got > num_warps:
        return True
    import warnings

    warnings.warn(f"tilefuse: Triton did not warp-specialize {name} (compiled with {got} warps for a "
                  f"{num_warps}-warp launch asking WARP_SPEC); it runs unspecialized and slow. Use a config "
                  "without WARP_SPEC, or report this with your Triton version.", RuntimeWarning, stacklevel=3)
    return False


@functools.cache
def knobs_runtime():
    """Triton's runtime knobs: the launch hooks a profiler installs are read there at each launch."""
    from triton import knobs

    return knobs.runtime


def no_hook(hook) -> bool:
    """Whether a launch hook is unset: None (Triton 3.6) or an empty HookChain (3.7)."""
    return hook is None or not getattr(hook, "calls", True)


# -- direct launches ---------------------------------------------------------------------------------
#
# What Triton's CUDA launcher (3.6 and 3.7) passes a kernel: its arguments in order, less the
# constexpr ones (declared constants and the values Triton specialised, such as an integer equal to
# 1), each by value in its C type (pointers as 64-bit addresses, i1 as one byte, fp32 as a float),
# then two pointers: the global scratch (allocated per launch through ``triton.set_allocator``'s
# allocator when the kernel asks for some: device-side tensor descriptors) and the profiler's
# scratch. A direct launch packs the same buffer once and checks it against the parameters the
# compiled kernel declares (its PTX entry): any difference, or anything else it does not handle
# (tuples, host tensor descriptors, fp16 scalars, clusters, cooperative or PDL launches, a profiler's
# scratch), and the launch stays on Triton's path.

_SCALAR_CTYPES = {
    "i1": ctypes.c_int8, "i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32, "i64": ctypes.c_int64,
    "u1": ctypes.c_uint8, "u8": ctypes.c_uint8, "u16": ctypes.c_uint16, "u32": ctypes.c_uint32,
    "u64": ctypes.c_uint64, "fp32": ctypes.c_float, "f32": ctypes.c_float, "fp64": ctypes.c_double,
}
_PTX_PARAM = re.compile(r"\.param\s+(?:\.align\s+\d+\s+)?\.([a-z]+)(\d+)\b[^,]*?(?:\[(\d+)\])?\s*(?:,|$)")
GLOBAL_SCRATCH, PROFILE_SCRATCH = -1, -2  # layout indices of the two trailing pointers

_DIRECT = [os.environ.get("TILEFUSE_TRITON_LAUNCHER", "0") in ("", "0")]


def set_direct_launches(on: bool) -> bool:
    """Whether plans replay their launches directly (:class:`DirectLaunch`; the default) or through
    Triton's launcher; returns the previous setting. Read at each replayed launch."""
    old, _DIRECT[0] = _DIRECT[0], bool(on)
    return old


def read_env() -> None:
    """Take ``TILEFUSE_TRITON_LAUNCHER`` from the environment again (benchmarks switch it)."""
    set_direct_launches(os.environ.get("TILEFUSE_TRITON_LAUNCHER", "0") in ("", "0"))


def ptx_params(ptx: str, name: str) -> list[int] | None:
    """Byte sizes of the parameters of the PTX entry ``name``, in order (None if not found)."""
    m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.S)
    if m is None:
        return None
    sizes = []
    for decl in m.group(1).split(","):
        decl = decl.strip()
        if not decl:
            continue
        found = _PTX_PARAM.search(decl + ",")
        if found is None:
            return None
        _, bits, count = found.groups()
        sizes.append(int(count) if count else int(bits) // 8)
    return sizes


def param_layout(signature: dict, ptx_sizes: list[int] | None) -> tuple[list, str]:
    """The parameter buffer of a kernel of Triton ``signature`` (argument name -> Triton type, in
    argument order) as ``[(argument index, ctype), ...]`` (index :data:`GLOBAL_SCRATCH` /
    :data:`PROFILE_SCRATCH` for the trailing pointers), checked against the sizes the compiled kernel
    declares; ``([], why)`` where a direct launch cannot make it."""
    layout = []
    for i, ty in enumerate(signature.values()):
        if not isinstance(ty, str):
            return [], f"argument {i} is a tuple"
        if ty == "constexpr":
            continue
        if ty.startswith("*"):
            layout.append((i, ctypes.c_uint64))
        elif ty in _SCALAR_CTYPES:
            layout.append((i, _SCALAR_CTYPES[ty]))
        else:
            return [], f"argument {i} has type {ty}"
    layout += [(GLOBAL_SCRATCH, ctypes.c_uint64), (PROFILE_SCRATCH, ctypes.c_uint64)]
    if ptx_sizes is None:
        return [], "no PTX entry"
    sizes = [ctypes.sizeof(c) for _, c in layout]
    if sizes != ptx_sizes:
        return [], f"parameters {sizes} where the kernel declares {ptx_sizes}"
    return layout, ""


@functools.cache
def _driver():
    """libcuda's cuLaunchKernel and cuGetErrorString, or None."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    vp, u = ctypes.c_void_p, ctypes.c_uint
    launch = lib.cuLaunchKernel
    launch.restype = ctypes.c_int
    launch.argtypes = [vp, u, u, u, u, u, u, u, vp, vp, vp]
    errstr = lib.cuGetErrorString
    errstr.restype = ctypes.c_int
    errstr.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    attribute = lib.cuPointerGetAttribute
    attribute.restype = ctypes.c_int
    attribute.argtypes = [vp, ctypes.c_int, ctypes.c_uint64]
    return launch, errstr, attribute


_CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3
_CUDA_ERROR_INVALID_CONTEXT = 201


def device_pointer(address: int) -> int | None:
    """The device-side address of host or device memory at ``address`` (what Triton's launcher asks
    the driver for each pointer it is given as a tensor), or None."""
    drv = _driver()
    if drv is None:
        return None
    out = ctypes.c_uint64()
    if drv[2](ctypes.byref(out), _CU_POINTER_ATTRIBUTE_DEVICE_POINTER, address):
        return None
    return out.value


class DirectLaunch:
    """One kernel launch replayed by ``cuLaunchKernel`` on a parameter buffer packed at creation.

    ``cell(i)`` is the ctypes value of argument ``i``: a replay writes the call's own pointers into
    their cells, then calls the object with the grid and the stream's handle."""

    __slots__ = ("name", "function", "block", "shared", "cells", "params", "params_at", "scratch")

    def __init__(self, compiled, layout: list, values: list):
        md = compiled.metadata
        self.name = getattr(md, "name", "kernel")
        self.function = compiled.function
        self.block = 32 * md.num_warps
        self.shared = md.shared
        self.cells = {}
        cells = []
        for index, ctype in layout:
            value = 0 if index < 0 else values[index]
            cell = ctype(float(value) if ctype in (ctypes.c_float, ctypes.c_double) else int(value))
            cells.append(cell)
            self.cells[index] = cell
        self.params = (ctypes.c_void_p * len(cells))(*[ctypes.addressof(c) for c in cells])
        self.params_at = ctypes.addressof(self.params)
        size = md.global_scratch_size
        self.scratch = (size, md.global_scratch_align, self.cells[GLOBAL_SCRATCH]) if size else None

    def cell(self, index: int):
        return self.cells[index]

    def __call__(self, g0: int, g1: int, g2: int, stream: int) -> None:
        if g0 * g1 * g2 == 0:
            return
        if self.scratch is not None:
            from triton.runtime import _allocation

            size, align, cell = self.scratch
            buf = _allocation._allocator.get()(size * g0 * g1 * g2, align, stream)
            cell.value = buf.data_ptr()
        launch, errstr, _ = _driver()
        err = launch(self.function, g0, g1, g2, self.block, 1, 1, self.shared, stream, self.params_at, None)
        if err == _CUDA_ERROR_INVALID_CONTEXT:  # a thread with no context current: make the device's
            import torch  # primary context current, as Triton's launcher does, and launch again

            torch.cuda.set_device(torch.cuda.current_device())
            err = launch(self.function, g0, g1, g2, self.block, 1, 1, self.shared, stream, self.params_at, None)
        if err:
            text = ctypes.c_char_p()
            errstr(err, ctypes.byref(text))
            raise RuntimeError(f"tilefuse: launching {self.name} failed: CUDA error {err} "
                               f"({(text.value or b'?').decode()})")


def direct_available() -> bool:
    """Whether this process can make direct launches (the CUDA driver library loads)."""
    return not _env.interpreting() and _driver() is not None


def direct_launch(compiled, values: list) -> tuple[DirectLaunch | None, str]:
    """A :class:`DirectLaunch` of ``compiled`` with the argument ``values`` (device pointers as ints),
    or ``(None, why not)``."""
    if _driver() is None:
        return None, "no libcuda"
    md = getattr(compiled, "metadata", None)
    if md is None or not hasattr(md, "name"):
        return None, "not a compiled Triton kernel"
    if getattr(md, "num_ctas", 1) != 1 or getattr(md, "launch_cooperative_grid", False) \
            or getattr(md, "launch_pdl", False) or getattr(md, "profile_scratch_size", 0):
        return None, "a cluster, cooperative, PDL or profiled launch"
    src = getattr(compiled, "src", None)
    signature = getattr(src, "signature", None)
    if not isinstance(signature, dict) or len(signature) != len(values):
        return None, "no signature of the launch's arguments"
    asm = getattr(compiled, "asm", None) or {}
    ptx = asm.get("ptx") if hasattr(asm, "get") else None
    if isinstance(ptx, bytes):
        ptx = ptx.decode()
    layout, why = param_layout(signature, ptx_params(ptx, md.name) if ptx else None)
    if why:
        return None, why
    for index, ctype in layout:
        if index >= 0 and ctype is ctypes.c_uint64 and not isinstance(values[index], int):
            return None, f"argument {index} is not an address"
    return DirectLaunch(compiled, layout, values), ""
