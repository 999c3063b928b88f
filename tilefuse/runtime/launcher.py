"""A lower-overhead launch of tilefuse's Triton kernels on a GPU.

Triton's ``kernel[grid](...)`` binds, specialises and hashes every argument on every call (tens of
microseconds). :class:`FastKernel` keeps, per kernel, the compiled binary for each *argument
signature* seen (what Triton specialises on) and launches it directly; a signature's first launch,
and every launch in the interpreter, goes through Triton.
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import triton
from triton import knobs
from triton.runtime.driver import driver

from . import _env

_NO_DEFAULT = inspect.Parameter.empty
_NOOP = [False]  # noop_launches() is active


@contextlib.contextmanager
def noop_launches():
    """Inside the block kernel launches do their host lookups only (benchmarks of the host path)."""
    old, _NOOP[0] = _NOOP[0], True
    try:
        yield
    finally:
        _NOOP[0] = old


def _current_stream():
    """The stream Triton would launch on (the current device's current stream)."""
    active = driver.active
    return active.get_current_stream(active.get_current_device())


class FastKernel:
    """Wraps a ``@triton.jit`` kernel: ``k[grid](...)`` launches as Triton would; other attributes are its."""

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
        self._binders: dict = {}  # (positional count, keyword names) -> its binder (see _binder)
        self._key_of = None  # the argument signature's key, as code made for the first launch's kinds
        self._fast = not _env.interpreting()

    def __getattr__(self, name):
        return getattr(self.jit_fn, name)

    def __getitem__(self, grid):
        if _NOOP[0]:
            return self._skip
        if not self._fast:
            return self.jit_fn[grid]
        return functools.partial(self._launch, grid)

    def _skip(self, *args, **kwargs):
        """A launch under :func:`noop_launches`: :meth:`_launch`'s host lookups, no kernel."""
        bound = self._bind(args, kwargs)
        if bound is not None:
            try:
                self._compiled.get(self._signature(*bound))
            except TypeError:  # an unhashable argument
                pass

    def _binder(self, n_args: int, names: tuple):
        """``bind(args, kwargs) -> (values, options)`` (parameters in order, defaults filled in; launch options)
        written out for calls of ``n_args`` positionals and keywords ``names``; None where they cannot bind."""
        parts = []
        for i, name in enumerate(self._names):
            given = i < n_args
            if name in names:
                if given:
                    return None
                parts.append(f"k[{name!r}]")
            elif given:
                parts.append(f"a[{i}]")
            elif self._defaults[i] is not _NO_DEFAULT:
                parts.append(f"d[{i}]")
            else:
                return None
        if n_args > len(self._names):
            return None
        options = "".join(f"({n!r}, k[{n!r}]), " for n in sorted(n for n in names if n not in self._index))
        return eval(f"lambda a, k: ([{', '.join(parts)}], ({options}))", {"d": self._defaults})  # noqa: S307

    def _bind(self, args: tuple, kwargs: dict):
        shape = (len(args), tuple(kwargs))
        bind = self._binders.get(shape)
        if bind is None:
            bind = self._binders[shape] = self._binder(*shape) or (lambda a, k: None)
        return bind(args, kwargs)

    def _signature(self, values: list, options: tuple):
        if self._key_of is None:
            self._key_of = _key_function(values, self._constexpr, self._dns)
        try:
            key = self._key_of(values)
        except (AttributeError, TypeError, IndexError):  # an argument of another kind than at first
            key = ("any",) + tuple(v if self._constexpr[i] else _spec(v, i not in self._dns)
                                   for i, v in enumerate(values))
        return key, options

    def _launch(self, grid, *args, **kwargs):
        """Launch; returns the compiled kernel, as Triton does."""
        bound = self._bind(args, kwargs)
        if bound is None:
            return self.jit_fn[grid](*args, **kwargs)
        values, options = bound
        try:
            key = self._signature(values, options)
            compiled = self._compiled.get(key)
        except TypeError:  # an unhashable argument
            return self.jit_fn[grid](*args, **kwargs)
        if compiled is None:
            compiled = self.jit_fn[grid](*args, **kwargs)  # compiles (or finds) the binary, and launches
            if compiled is not None and hasattr(compiled, "run"):
                self._compiled[key] = compiled
                spec = self._index.get("WARP_SPEC")
                if spec is not None and values[spec]:
                    check_specialized(self.jit_fn.fn.__name__, kwargs.get("num_warps", 4), compiled)
            return compiled
        stream = _current_stream()
        g0, g1, g2 = (*grid, 1, 1)[:3]
        enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook  # a profiler's hooks
        if no_hook(enter) and no_hook(leave):  # no profiler listening: no launch metadata to build
            enter = leave = meta = None
        else:
            meta = compiled.launch_metadata(grid, stream, *values)
        compiled.run(g0, g1, g2, stream, compiled.function, compiled.packed_metadata, meta, enter, leave, *values)
        return compiled


def _key_expr(name: str, v, specialize: bool) -> str:
    """Source of the key's entries for argument ``name`` whose first value was ``v``: :func:`_spec`'s facts,
    but a specialised integer by its value (finer than Triton's classes, and cheaper)."""
    if hasattr(v, "data_ptr"):  # another kind later raises AttributeError: the generic key is taken
        return f"{name}.dtype, not {name}.data_ptr() & 15"
    if type(v) is int:
        width = f"type({name}), -2147483648 <= {name} < 2147483648, {name} < 9223372036854775808"
        return f"{name}, {name}.__class__" if specialize else width
    if type(v) is tuple:  # its integers keyed as specialised: Triton 3.6 specialises them, whatever the parameter
        return ", ".join([f"len({name})"] + [_key_expr(f"{name}[{j}]", x, True) for j, x in enumerate(v)])
    if isinstance(v, (bool, float)):
        return f"type({name}), {name}" if type(v) is bool else f"type({name})"
    return name  # None, strings: hashed as they are


def _key_function(values: list, constexpr: list, dns: set):
    """``key(args)``: what Triton specialises on, written out for the kinds of ``values`` (no dispatch) as one
    flat tuple (no nested tuple to build and hash: each entry's place is fixed by the first launch's kinds)."""
    parts = [f"a[{i}]" if constexpr[i] else _key_expr(f"a[{i}]", v, i not in dns) for i, v in enumerate(values)]
    return eval("lambda a: (" + ", ".join(parts) + ",)")  # noqa: S307 - source built above from indices


def _spec(v, specialize: bool):
    """What Triton specialises a non-constexpr argument on: a tensor's dtype and 16-byte alignment, an int's
    width (specialised: whether 1 or a multiple of 16); a tuple's elements alike, its ints always as
    specialised (Triton 3.6 does so even where the parameter is not: a binary for ``gen == 1`` has the 1 in it)."""
    if hasattr(v, "data_ptr"):
        return v.dtype, v.data_ptr() & 15 == 0
    if isinstance(v, bool):
        return "b", v
    if isinstance(v, int):
        width = 32 if -(2**31) <= v < 2**31 else (64 if -(2**63) <= v < 2**63 else 65)
        return ("i", width, v == 1, v % 16 == 0) if specialize else ("i", width)
    if isinstance(v, float):
        return "f"
    if type(v) is tuple:
        return tuple(_spec(x, True) for x in v)
    return v  # None, strings: hashed as they are (unhashable -> the Triton path)


def check_specialized(name: str, num_warps: int, compiled) -> bool:
    """Whether a kernel launched with ``WARP_SPEC`` came out warp-specialized (more compiled warps than
    ``num_warps``). Warns when not: Triton skips a kernel it cannot specialize silently (several times slower)."""
    got = getattr(getattr(compiled, "metadata", None), "num_warps", None)
    if got is None or got > num_warps:
        return True
    import warnings

    warnings.warn(f"tilefuse: Triton did not warp-specialize {name} (compiled with {got} warps for a "
                  f"{num_warps}-warp launch asking WARP_SPEC); it runs unspecialized and slow. Use a config "
                  "without WARP_SPEC, or report this with your Triton version.", RuntimeWarning, stacklevel=3)
    return False


def no_hook(hook) -> bool:
    """Whether a launch hook is unset: None (Triton 3.6) or an empty HookChain (3.7)."""
    return hook is None or not getattr(hook, "calls", True)


# Integers that change per call or rank: never specialised on (else an epoch recompiles at 1, 16, ... and
# ranks run different binaries). Triton 3.6 ignores this for the `call` tuple (keyed as specialised here).
_RUNTIME_INTS = ("epoch", "cur_rank", "sig", "gen", "n_out0", "n_out1", "call")


def _label(fn) -> str:
    """``op.variant:kernel`` for a kernel defined in ``tilefuse.ops.<op>.<variant>`` (else its module)."""
    parts = fn.__module__.split(".")
    where = ".".join(parts[2:]) if parts[:2] == ["tilefuse", "ops"] else fn.__module__.rsplit(".", 1)[-1]
    return f"{where}:{fn.__name__.lstrip('_')}"


def _launch_metadata(label: str):
    def describe(grid, metadata, args):
        # Only evaluated when a profiler hook is installed (triton's launch_enter_hook).
        sizes = {k: args[k] for k in ("M", "N", "K", "M_loc", "rows") if isinstance(args.get(k), int)}
        name = f"{label} [" + ", ".join(f"{k}={v}" for k, v in sizes.items()) + "]" if sizes else label
        out = {"name": name}
        m = sizes.get("M", sizes.get("M_loc"))
        if m is not None and "N" in sizes and "K" in sizes:
            out["flops"] = 2 * m * sizes["N"] * sizes["K"]
        return out

    return describe


def kernel(fn):
    """``triton.jit`` for a kernel tilefuse launches (:data:`_RUNTIME_INTS` unspecialised, named for profilers)."""
    names = [n for n in inspect.signature(fn).parameters if n in _RUNTIME_INTS]
    return FastKernel(triton.jit(do_not_specialize=names, launch_metadata=_launch_metadata(_label(fn)))(fn), names)
