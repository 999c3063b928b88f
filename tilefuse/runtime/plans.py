"""Launch plans: a recorded op call, replayed for new tensors of the same call signature.

An op call is a fixed sequence once its *call signature* (shapes, strides,
dtypes, devices, pointer alignment, config, group, keyword arguments) is fixed: the same checks
pass, the same config and workspaces come back, the same kernels launch with the same constant
arguments; only the data pointers of the call's own tensors change. A :class:`Recorder` watches one
ordinary call and writes down, in order, what it did on the device side:

* every kernel launch (``FastKernel`` only: another Triton launch makes the call unplannable),
  with the compiled binary and its bound argument list;
* every torch operation (seen through a ``TorchFunctionMode``): views of constant tensors are
  folded into constants, everything else (allocating the output, copies, views of the call's
  tensors) is replayed; metadata queries (shape, strides, ``data_ptr``...) are skipped, and an
  operation that reads tensor data on the host (``item``, ``tolist``, ``bool(t)``) makes the call
  unplannable;
* host steps its caller asks for (:meth:`Recorder.host`): stream forks and joins, workspace
  use, the collective call's begin mark;
* host functions that queue device work by other means (:meth:`Recorder.call`: copy-engine
  copies), replayed with the new call's tensors.

Every tensor is either one of the call's (an argument, or made from one by a recorded operation:
replayed with the new call's tensors) or a *constant* (workspaces, the control block), which the
caller's ``constant_ok`` must accept. The resulting :class:`Plan` replays the steps with the new
call's argument tensors in their slots: no checks, no config or workspace lookup, no argument
binding. Plans are dropped by :func:`clear_plans` (workspace release or eviction, ``reset``,
``shutdown``, a generation bump), after which calls record again.
"""

from __future__ import annotations

import threading

import torch
from torch.overrides import TorchFunctionMode

# Tensor methods and properties that only read metadata: skipped by the recorder. Their results are
# fixed by the call signature (shapes, strides, dtypes, devices, pointer alignment).
_METADATA = frozenset((
    "shape", "dtype", "device", "stride", "size", "dim", "ndim", "ndimension", "numel", "nelement",
    "element_size", "itemsize", "nbytes", "is_contiguous", "is_floating_point", "is_complex", "is_signed",
    "data_ptr", "storage_offset", "untyped_storage", "layout", "requires_grad", "is_cuda", "is_cpu", "is_meta",
    "is_leaf", "grad_fn", "names", "is_sparse", "is_quantized", "is_mkldnn", "is_nested", "is_inference",
    "__len__", "get_device", "is_pinned", "is_shared", "_is_view", "has_names", "is_neg", "is_conj",
    "result_type", "promote_types", "can_cast", "is_tensor", "is_storage", "__hash__", "_version",
))
_INPLACE_DUNDERS = frozenset((
    "__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__", "__ipow__",
    "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__imatmul__",
))


def _func_name(func) -> str:
    name = getattr(func, "__name__", "")
    if name in ("__get__", "__set__"):  # a property: the descriptor's name
        owner = getattr(func, "__self__", None)
        name = getattr(owner, "__name__", name)
    return name


def _mutating(name: str, kwargs: dict) -> bool:
    if name in _INPLACE_DUNDERS or (name.endswith("_") and not name.endswith("__")):
        return True
    return kwargs.get("out") is not None


class _Ref:
    """A slot of the plan: one of the call's tensors."""

    __slots__ = ("slot",)

    def __init__(self, slot: int):
        self.slot = slot


def _build(template, slots: list):
    """``template`` with every :class:`_Ref` replaced by its slot's tensor (lists, tuples, dicts)."""
    if type(template) is _Ref:
        return slots[template.slot]
    if type(template) in (list, tuple):
        return type(template)(_build(t, slots) for t in template)
    if type(template) is dict:
        return {k: _build(v, slots) for k, v in template.items()}
    return template


class _Bound:
    """Positional and keyword arguments with some tensors taken from slots at replay."""

    __slots__ = ("args", "kwargs", "subs", "ksubs", "nested", "used")

    def __init__(self, args: list, kwargs: dict, subs: list, ksubs: list, nested: list, used: set):
        self.args, self.kwargs, self.subs, self.ksubs, self.nested, self.used = args, kwargs, subs, ksubs, nested, used

    def fill(self, slots: list) -> tuple[list, dict]:
        args = self.args.copy()
        for i, s in self.subs:
            args[i] = slots[s]
        kwargs = self.kwargs
        if self.ksubs:
            kwargs = kwargs.copy()
            for k, s in self.ksubs:
                kwargs[k] = slots[s]
        for where, t in self.nested:
            if type(where) is int:
                args[where] = _build(t, slots)
            else:
                kwargs = kwargs.copy() if kwargs is self.kwargs else kwargs
                kwargs[where] = _build(t, slots)
        return args, kwargs


class Replay:
    """What the steps of one replay share: the collective call, the launch stream and host objects."""

    __slots__ = ("call", "stream", "capturing", "objs")

    def __init__(self, call, stream, capturing: bool):
        self.call, self.stream, self.capturing, self.objs = call, stream, capturing, {}

    def close(self) -> None:
        """Leave the side-stream blocks a failed replay left open (context managers kept under tuple
        keys of ``objs``)."""
        for key in [k for k in self.objs if type(k) is tuple]:
            self.objs.pop(key).__exit__(None, None, None)


class Plan:
    """A recorded call: ``run(inputs, replay)`` repeats it for new argument tensors (same signature).
    ``state``: the runtime state of the process group the call ran on (None: the default group's),
    set by the caller; a replay runs on it."""

    __slots__ = ("steps", "n_slots", "n_inputs", "ret", "alive", "what", "launches", "state", "graph")

    def __init__(self, steps: list, n_slots: int, n_inputs: int, ret, what: str, launches: int):
        self.steps, self.n_slots, self.n_inputs, self.ret = steps, n_slots, n_inputs, ret
        self.alive = True
        self.what = what
        self.launches = launches
        self.state = None
        self.graph = None  # its graph form (tilefuse.runtime.relaunch): None not tried yet, False none

    def run(self, inputs: list, replay: Replay):
        return _build(self.ret, self.run_slots(inputs, replay))

    def run_slots(self, inputs: list, replay: Replay) -> list:
        """Run the steps for ``inputs``; return every slot (the arguments, then what the steps made)."""
        slots = inputs + [None] * (self.n_slots - self.n_inputs)
        for step in self.steps:
            step(slots, replay)
        STATS["replays"] += 1
        return slots


def build_result(template, slots: list):
    """A plan's result (``Plan.ret``) from its slots."""
    return _build(template, slots)


class PlanNotPossible(Exception):
    """Raised inside the recorder; ends the recording, never the call."""


class _Mode(TorchFunctionMode):
    def __init__(self, rec):
        super().__init__()
        self.rec = rec

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return self.rec.torch_op(func, args, kwargs or {})


_REC = None  # the active Recorder (one at a time: recording happens inside a call, under its lock)
_PLANS_LOCK = threading.Lock()
STATS = {"recorded": 0, "replays": 0, "unplannable": 0, "retried": 0, "cleared": 0, "graph_forms": 0,
         "relaunches": 0}
LAST_FAILURE: list = [""]  # why the last recording gave up (for tests and logs)
_ALL_PLANS: list = []  # every live Plan, so that clear_plans can mark them dead


def recorder():
    """The recorder watching this thread's current call, or None."""
    rec = _REC
    if rec is not None and rec.thread == threading.get_ident():
        return rec
    return None


class Recorder:
    """Records one call into a :class:`Plan` (a context manager around the call's host code).

    ``inputs``: the call's argument tensors (slots 0, 1, ...); ``constant_ok(t)``: whether a tensor
    that is not one of the call's may be baked into the plan (e.g. it is a workspace on the heap and
    does not overlap the call's own tensors). After the block, :attr:`failure` says why no plan can
    be made (None: :meth:`plan` makes one), and :attr:`retry` whether a later call may try again.
    """

    def __init__(self, inputs: list, constant_ok, what: str):
        self.thread = threading.get_ident()
        self.inputs = list(inputs)
        self.constant_ok = constant_ok
        self.what = what
        self.steps: list = []  # (kind, payload, used slots, pure, out slots)
        self.keep: list = list(inputs)  # every tensor seen stays alive: ids stay unique
        self.ids = {id(t): i for i, t in enumerate(inputs)}
        self.n_slots = len(inputs)
        self.constants: set = set()
        self.failure: str | None = None
        self.retry = False
        self.paused = False
        self.launches = 0
        self._mode = _Mode(self)
        self._patched: list = []

    # -- context -------------------------------------------------------------------------------

    def __enter__(self):
        global _REC
        if _REC is not None:
            raise RuntimeError("a launch plan is already being recorded")
        _REC = self
        self._guard_triton()
        self._mode.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb):
        global _REC
        try:
            self._mode.__exit__(exc_type, exc, tb)
        finally:
            _REC = None
            for cls, name, fn in self._patched:
                setattr(cls, name, fn)
            self._patched.clear()
        if exc is not None:
            if self.failure is None:
                self.give_up(f"the call raised {type(exc).__name__}", retry=True)
            self.release()  # the exception's frames keep this recorder: not the workspaces it saw
        return False

    def release(self) -> None:
        """Drop every tensor and step the recording holds (heap blocks must come back on every rank
        alike, whatever still refers to this object)."""
        self.steps, self.keep, self.inputs = [], [], []
        self.ids, self.constants = {}, set()

    def _guard_triton(self) -> None:
        """A Triton launch that does not go through FastKernel would be missing from the plan."""
        from triton.runtime import jit

        classes = [jit.JITFunction]
        try:
            from triton.runtime.interpreter import InterpretedFunction

            classes.append(InterpretedFunction)
        except ImportError:  # pragma: no cover - older Triton
            pass
        for cls in classes:
            original = cls.__dict__.get("run")
            if original is None:
                continue

            def guarded(fn_self, *args, _original=original, **kwargs):
                if not self.paused:
                    self.give_up(f"a Triton kernel ({getattr(fn_self, '__name__', fn_self)}) launched outside "
                                 "FastKernel")
                return _original(fn_self, *args, **kwargs)

            self._patched.append((cls, "run", original))
            cls.run = guarded

    def give_up(self, why: str, retry: bool = False) -> None:
        """No plan from this recording (``retry``: a later call of the signature may record again)."""
        if self.failure is None:
            self.failure = why
            self.retry = retry

    # -- tensors -------------------------------------------------------------------------------

    def _slot_of(self, t: torch.Tensor) -> int | None:
        """The slot of one of the call's tensors, or None for an accepted constant."""
        slot = self.ids.get(id(t))
        if slot is not None:
            return slot
        if id(t) not in self.constants:
            if type(t) is not torch.Tensor or not self.constant_ok(t):
                raise PlanNotPossible(f"a tensor that is neither the call's nor a constant it may keep "
                                      f"({tuple(t.shape)} {t.dtype} on {t.device})")
            self.constants.add(id(t))
            self.keep.append(t)
        return None

    def _template(self, obj):
        """``obj`` with the call's tensors replaced by :class:`_Ref` (and whether there were any)."""
        if isinstance(obj, torch.Tensor):
            slot = self._slot_of(obj)
            return (obj, False) if slot is None else (_Ref(slot), True)
        if type(obj) in (list, tuple):
            items = [self._template(o) for o in obj]
            return type(obj)(t for t, _ in items), any(r for _, r in items)
        if type(obj) is dict:
            items = {k: self._template(v) for k, v in obj.items()}
            return {k: t for k, (t, _) in items.items()}, any(r for _, r in items.values())
        return obj, False

    def _bind(self, args, kwargs) -> _Bound:
        a = list(args)
        k = dict(kwargs)
        subs, ksubs, nested, used = [], [], [], set()
        for where, direct in ((a, subs), (k, ksubs)):  # positional, then keyword arguments
            for key, x in (enumerate(list(where)) if where is a else list(where.items())):
                t, refs = self._template(x)
                if refs:
                    if type(t) is _Ref:
                        direct.append((key, t.slot))
                        used.add(t.slot)
                    else:
                        nested.append((key, t))
                        used |= _slots_in(t)
                    where[key] = None
        return _Bound(a, k, subs, ksubs, nested, used)

    def _new_slot(self, t: torch.Tensor) -> int:
        slot = self.n_slots
        self.n_slots += 1
        self.ids[id(t)] = slot
        self.keep.append(t)
        return slot

    # -- what the call does --------------------------------------------------------------------

    def torch_op(self, func, args, kwargs):
        if self.paused or self.failure is not None:
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        name = _func_name(func)
        if name in _METADATA:
            return out
        try:
            if isinstance(out, torch.Tensor):
                outs = [out]
            elif type(out) in (tuple, list) and all(isinstance(o, torch.Tensor) for o in out):
                outs = list(out)
            elif out is None:
                outs = []
            else:
                raise PlanNotPossible(f"{name} reads tensor data on the host")
            bound = self._bind(args, kwargs)
            mutating = _mutating(name, kwargs)
            ins = [x for x in _tensors_in((args, kwargs))]
            if not bound.used and not mutating and outs and all(_shares_storage(o, ins) for o in outs):
                for o in outs:  # a view of constants is a constant
                    self._slot_of(o)
                return out
            in_ids = {id(x) for x in ins}
            out_slots = [None if id(o) in in_ids else self._new_slot(o) for o in outs]
            fresh = not ins and not mutating and bool(outs)  # reads no tensor: may run ahead of the plan
            self.steps.append(("torch", (func, bound, out_slots, isinstance(out, torch.Tensor), fresh), bound.used,
                               not mutating and bool(outs), out_slots))
        except PlanNotPossible as err:
            self.give_up(str(err))
        return out

    def launch(self, kernel, grid, *args, **kwargs):
        if self.paused or self.failure is not None:
            self.paused = True
            try:
                return kernel._run(grid, args, kwargs)[0]
            finally:
                self.paused = False
        try:
            if not (type(grid) is tuple and all(type(g) is int for g in grid)):
                raise PlanNotPossible(f"grid {grid!r} is not a tuple of ints")
            bound = self._bind(args, kwargs)
        except PlanNotPossible as err:
            self.give_up(str(err))
            bound = None
        self.paused = True
        try:
            ret, compiled, values = kernel._run(grid, args, kwargs)
        finally:
            self.paused = False
        if bound is not None and self.failure is None:
            fast = None
            if compiled is not None:
                try:
                    on_device = {i for i, v in enumerate(values) if _device_memory(v)}
                    fast = (compiled, self._bind(values, {}), on_device)
                except PlanNotPossible as err:
                    self.give_up(str(err))
                    return ret
            self.steps.append(("launch", (kernel, grid, bound, fast), bound.used, False, []))
            self.launches += 1
        return ret

    def host(self, fn) -> None:
        """Replay ``fn(replay)`` at this point of the call (``replay``: the :class:`_Replay`)."""
        if self.failure is None:
            self.steps.append(("host", fn, set(), False, []))

    def mark(self) -> int:
        """A position in the recording, for :meth:`fast_launches_since`."""
        return len(self.steps)

    def fast_launches_since(self, mark: int) -> bool:
        """Whether every step recorded since ``mark`` is a kernel launch replayed through its compiled
        launcher, with the stream the replay names (no torch operation, host step or other launch,
        which would run on torch's current stream)."""
        return all(kind == "launch" and payload[3] is not None for kind, payload, *_ in self.steps[mark:])

    def call(self, fn, *args) -> None:
        """Run ``fn(*args)`` now (its own torch operations unrecorded) and replay it with the new
        call's tensors in their slots: device work queued by other means than a kernel launch or a
        torch operation (a copy-engine transfer)."""
        bound = None
        if not self.paused and self.failure is None:
            try:
                bound = self._bind(args, {})
            except PlanNotPossible as err:
                self.give_up(str(err))
        was, self.paused = self.paused, True
        try:
            fn(*args)
        finally:
            self.paused = was
        if bound is not None and self.failure is None:
            self.steps.append(("call", (fn, bound), bound.used, False, []))

    # -- the plan ------------------------------------------------------------------------------

    def plan(self, result) -> Plan | None:
        """The plan of the recorded call that returned ``result`` (None if it cannot be made)."""
        if self.failure is None:
            try:
                ret, _ = self._template(result)
            except PlanNotPossible as err:
                self.give_up(str(err))
        if self.failure is not None:
            return None
        needed = _slots_in(ret)
        kept = []
        for kind, payload, used, pure, outs in reversed(self.steps):
            if pure and not any(s in needed for s in outs if s is not None):
                continue  # a view or a fresh tensor nothing uses
            needed |= used
            kept.append(_compile(kind, payload))
        kept.reverse()
        return Plan(kept, self.n_slots, len(self.inputs), ret, self.what, self.launches)


def _slots_in(template) -> set:
    if type(template) is _Ref:
        return {template.slot}
    if type(template) in (list, tuple):
        return set().union(*(_slots_in(t) for t in template)) if template else set()
    if type(template) is dict:
        return set().union(*(_slots_in(t) for t in template.values())) if template else set()
    return set()


def _tensors_in(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif type(obj) in (list, tuple):
        for o in obj:
            yield from _tensors_in(o)
    elif type(obj) is dict:
        for o in obj.values():
            yield from _tensors_in(o)


def _shares_storage(t: torch.Tensor, others: list) -> bool:
    ptr = t.untyped_storage().data_ptr()
    return any(ptr == o.untyped_storage().data_ptr() for o in others)


def _torch_step(func, bound: _Bound, out_slots: list, single: bool):
    """A recorded torch operation as a step; the common shapes (positional substitutions only, one
    output) without the general argument filling."""
    if single and not (bound.ksubs or bound.nested):
        args, subs, kwargs, dst = bound.args, bound.subs, bound.kwargs, out_slots[0]
        if not subs:  # allocates a fresh tensor: torch.empty(shape, ...)
            def factory_step(slots, replay):
                out = func(*args, **kwargs)
                if dst is not None:
                    slots[dst] = out

            return factory_step
        if len(subs) == 1 and len(args) == 1:  # a method of one of the call's tensors: t.clone()...
            src = subs[0][1]

            def unary_step(slots, replay):
                out = func(slots[src], **kwargs)
                if dst is not None:
                    slots[dst] = out

            return unary_step

        def positional_step(slots, replay):  # dst.copy_(src), t[index]...
            filled = args.copy()
            for i, s in subs:
                filled[i] = slots[s]
            out = func(*filled, **kwargs)
            if dst is not None:
                slots[dst] = out

        return positional_step

    def torch_step(slots, replay):
        args, kwargs = bound.fill(slots)
        out = func(*args, **kwargs)
        if single:
            if out_slots[0] is not None:
                slots[out_slots[0]] = out
        else:
            for s, o in zip(out_slots, out or ()):
                if s is not None:
                    slots[s] = o

    return torch_step


def _device_memory(v) -> bool:
    """Whether ``v`` is a tensor in device memory (launched by its address, :func:`_compile`)."""
    return isinstance(v, torch.Tensor) and v.is_cuda


def _compile(kind: str, payload):
    """One recorded step as a function ``step(slots, replay)``, its ``label`` saying what it does,
    ``fresh`` whether it is a torch operation that makes new tensors and reads none
    (``torch.empty``, ``torch.full``): such a step may run before every other step of the plan."""
    step = _compile_step(kind, payload[:4] if kind == "torch" else payload)
    step.kind = kind
    step.fresh = kind == "torch" and payload[4]
    # A host step marked ``in_graph`` (a stream fork or join) belongs in a plan's graph form with the
    # launches; other host steps are bookkeeping, run on every call (tilefuse.runtime.relaunch).
    step.in_graph = kind == "host" and bool(getattr(payload, "in_graph", False))
    step.programs = None
    if kind == "launch":
        step.programs = 1
        for g in payload[1]:  # the grid
            step.programs *= g
        step.label = f"launch {getattr(payload[0], '__name__', payload[0])}"
    elif kind == "torch":
        step.label = f"torch {_func_name(payload[0])}"
    else:
        fn = payload if kind == "host" else payload[0]
        fn = getattr(fn, "func", fn)  # a partial
        step.label = f"{kind} {getattr(fn, '__qualname__', fn)}"
    return step


def _compile_step(kind: str, payload):
    if kind == "host":
        def host_step(slots, replay, fn=payload):
            fn(replay)

        return host_step
    if kind == "torch":
        return _torch_step(*payload)
    if kind == "call":
        fn, bound = payload

        def call_step(slots, replay):
            args, _ = bound.fill(slots)
            fn(*args)

        return call_step
    kernel, grid, bound, fast = payload
    if fast is None:
        def triton_step(slots, replay):  # the interpreter, or a signature first compiled while recording
            args, kwargs = bound.fill(slots)
            kernel._run(grid, tuple(args), kwargs)

        return triton_step
    from . import launcher

    compiled, vbound, on_device = fast
    g0 = grid[0]
    g1 = grid[1] if len(grid) > 1 else 1
    g2 = grid[2] if len(grid) > 2 else 1
    function, packed = compiled.function, compiled.packed_metadata
    run = compiled.run
    hooks = launcher.knobs_runtime()
    no_hook = launcher.no_hook
    # Device tensors go to Triton's launcher as their addresses: it takes an int as the pointer
    # itself, where for a tensor it calls data_ptr() and asks the driver whether the address is
    # device memory, per pointer and launch. The constants are device tensors the plan keeps (and
    # the recorded launch checked); the call's own tensors have the recorded call's devices (the
    # call signature holds them). Other tensors (page-locked host memory) keep the checked path.
    keep = [v for v in vbound.args if isinstance(v, torch.Tensor)]
    template = [v.data_ptr() if _device_memory(v) else v for v in vbound.args]
    ptr_subs = [(i, s) for i, s in vbound.subs if i in on_device]
    obj_subs = [(i, s) for i, s in vbound.subs if i not in on_device]

    def fast_step(slots, replay, keep=keep):
        values = template.copy()
        for i, s in ptr_subs:
            values[i] = slots[s].data_ptr()
        for i, s in obj_subs:
            values[i] = slots[s]
        stream = replay.stream
        if stream is None:
            stream = replay.stream = launcher._current_stream()
        enter, leave = hooks.launch_enter_hook, hooks.launch_exit_hook
        if no_hook(enter) and no_hook(leave):
            run(g0, g1, g2, stream, function, packed, None, None, None, *values)
        else:
            meta = compiled.launch_metadata(grid, stream, *values)
            run(g0, g1, g2, stream, function, packed, meta, enter, leave, *values)

    return fast_step


def new_plan(plan: Plan) -> Plan:
    """Count ``plan`` among the live plans (so :func:`clear_plans` reaches it)."""
    with _PLANS_LOCK:
        _ALL_PLANS.append(plan)
    STATS["recorded"] += 1
    return plan


def clear_plans() -> None:
    """Every plan made so far is dead: its next call runs the full host path (and records again)."""
    with _PLANS_LOCK:
        for plan in _ALL_PLANS:
            plan.alive = False
            plan.steps, plan.ret = (), None  # its constants (workspace views) are released now
            if plan.graph:
                from . import relaunch

                relaunch.retire(plan.graph)  # destroyed after the next device synchronization
            plan.graph = None
        _ALL_PLANS.clear()
    STATS["cleared"] += 1
    for hook in _CLEAR_HOOKS:
        hook()


_CLEAR_HOOKS: list = []


def on_clear(hook) -> None:
    """Run ``hook()`` whenever :func:`clear_plans` runs (caches of plans drop their entries)."""
    if hook not in _CLEAR_HOOKS:
        _CLEAR_HOOKS.append(hook)
