"""Launch plans replayed as one CUDA graph launch: a plan's graph form.

A replayed plan costs one driver launch per kernel (a kernel of 20-30 parameters: 8-20 us on a busy
host) and two runtime calls per fork or join of a producer-consumer call's streams. Its graph form
captures one replay of the plan into a CUDA graph, once per plan; every later call writes its own
tensors' addresses into the kernel nodes that hold the captured ones
(``cuGraphExecKernelNodeSetParams``) and launches the graph (``cuGraphLaunch``) on the call's
stream. Measured in docs/PERF.md, "Host cost of an op call".

What makes it safe:

* The addresses a call changes are found by value: every 8-byte-aligned word of every kernel
  node's parameters (Triton's arguments, and the structures torch's kernels take) that points into
  one of the captured call's tensors (an argument, or a tensor the plan made from them: the output,
  views) is rewritten for the new call as that tensor's address plus the same offset. Arguments that
  overlapped one another in the captured call make the address ambiguous: no graph form then.
* The graph may hold only the plan's kernel launches: exactly one kernel node per launch step and
  no other node but empty ones. A torch operation of the plan that queued device work (a copy, a
  fill) or a copy-engine step would add nodes: no graph form. The plan's torch operations are then
  allocations and views, run eagerly on every call (fresh outputs), and its host steps (workspace
  bookkeeping, the collective call's begin marks) run eagerly after the launch; the forks and joins
  (``in_graph`` host steps) are part of the graph.
* A graph form lives as long as its plan; when plans are cleared it is destroyed only once the
  device has been synchronized (a launch may still be in flight).

Which plans get one: every plan with a kernel launch that passes the checks above (a one-kernel
call's graph launch also costs less host time than Triton's launcher: measured);
``TILEFUSE_GRAPH_RELAUNCH=0`` turns graph forms off (plans replay launch by launch). Tensors a plan
makes from nothing (its outputs: ``torch.empty``, or ``torch.full`` under ``TILEFUSE_DEBUG_POISON``)
are made before the capture and before every graph launch, so their fills are no nodes of the graph.
"""

from __future__ import annotations

import ctypes
import functools
import struct
import threading

import torch

from . import _env, plans
from .heap import span_bytes

_KERNEL_NODE, _EMPTY_NODE = 0, 5  # CUgraphNodeType
# Tensors a plan makes (its outputs) above this: no graph form (the captured ones stay with the graph;
# host time matters where the device's is short, that is for small outputs).
_MAX_MADE_BYTES = 1 << 20
_MAX_FORMS = 32  # live graph forms at most (each keeps a private memory pool of a few MiB)
_RETIRED: list = []  # graph forms of cleared plans, destroyed after the next device synchronization
LIVE = [0]  # graph forms of live plans
LAST_REFUSAL = [""]  # why the last plan that was to get a graph form got none
_LOCK = threading.Lock()


class _KernelNodeParams(ctypes.Structure):
    """CUDA_KERNEL_NODE_PARAMS_v2 (cuda.h)."""

    _fields_ = [("func", ctypes.c_void_p), ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint),
                ("blockDimZ", ctypes.c_uint), ("sharedMemBytes", ctypes.c_uint),
                ("kernelParams", ctypes.POINTER(ctypes.c_void_p)), ("extra", ctypes.c_void_p),
                ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


class _Driver:
    """The driver calls a graph form needs, through ctypes."""

    def __init__(self, lib):
        vp, sz = ctypes.c_void_p, ctypes.c_size_t

        def fn(name, *argtypes, optional=False):
            f = getattr(lib, name, None)
            if f is None:
                if optional:
                    return None
                raise AttributeError(name)
            f.restype, f.argtypes = ctypes.c_int, list(argtypes)
            return f

        self.get_nodes = fn("cuGraphGetNodes", vp, ctypes.POINTER(vp), ctypes.POINTER(sz))
        self.node_type = fn("cuGraphNodeGetType", vp, ctypes.POINTER(ctypes.c_int))
        self.get_params = fn("cuGraphKernelNodeGetParams_v2", vp, ctypes.POINTER(_KernelNodeParams))
        self.func_param = fn("cuFuncGetParamInfo", vp, sz, ctypes.POINTER(sz), ctypes.POINTER(sz))
        self.kernel_param = fn("cuKernelGetParamInfo", vp, sz, ctypes.POINTER(sz), ctypes.POINTER(sz), optional=True)
        self.set_params = fn("cuGraphExecKernelNodeSetParams_v2", vp, vp, ctypes.POINTER(_KernelNodeParams))
        self.launch = fn("cuGraphLaunch", vp, vp)
        self.func_name = fn("cuFuncGetName", ctypes.POINTER(ctypes.c_char_p), vp, optional=True)


@functools.cache
def driver() -> _Driver | None:
    """The driver's calls, or None (no GPU, or a driver without them: CUDA 12.4 or later needed)."""
    if not torch.cuda.is_available():
        return None
    try:
        return _Driver(ctypes.CDLL("libcuda.so.1"))
    except (OSError, AttributeError):
        return None


def _check(err: int, what: str) -> None:
    if err != 0:
        raise RuntimeError(f"tilefuse: {what} failed with CUDA driver error {err}")


def wanted(plan, setting: str | None) -> bool:
    """Whether ``plan`` is to get (or use) a graph form under ``TILEFUSE_GRAPH_RELAUNCH=setting``:
    every plan with a launch (the default), none with the switch ``0``."""
    return setting != "0" and plan.graph is not False and plan.launches >= 1


def find_addresses(words: list, ranges: list, n_inputs: int) -> list | None:
    """``[(word index, slot, offset)]`` for the ``words`` (8-byte values) that point into one of
    ``ranges`` (``(slot, address, bytes)``, slots below ``n_inputs`` the call's arguments): the slot
    of the lowest index whose range holds the word. None if two arguments' ranges overlap (the
    address would be ambiguous in a later call)."""
    spans = sorted((addr, addr + size, slot) for slot, addr, size in ranges if size > 0)
    inputs = [(lo, hi) for lo, hi, slot in spans if slot < n_inputs]
    for (_, hi0), (lo1, _) in zip(inputs, inputs[1:]):  # sorted by address: a neighbour overlaps if any does
        if lo1 < hi0:
            return None
    found = []
    for i, w in enumerate(words):
        best = None
        for lo, hi, slot in spans:
            if lo > w:
                break
            if w < hi and (best is None or slot < best[0]):
                best = (slot, w - lo)
        if best is not None:
            found.append((i, best[0], best[1]))
    return found


class _Node:
    """A kernel node whose parameters hold the call's addresses: its parameters copied into a
    buffer of ours, the words to rewrite, and the struct ``cuGraphExecKernelNodeSetParams`` reads."""

    __slots__ = ("handle", "buf", "ptrs", "params", "ref", "words")

    def __init__(self, handle, params: _KernelNodeParams, layout: list, buf, words: list):
        self.handle, self.buf, self.words = handle, buf, words
        base = ctypes.addressof(buf)
        self.ptrs = (ctypes.c_void_p * max(len(layout), 1))(*[base + off for off, _ in layout])
        params.kernelParams = ctypes.cast(self.ptrs, ctypes.POINTER(ctypes.c_void_p))
        params.extra = None
        self.params = params
        self.ref = ctypes.byref(params)


def _param_layout(drv: _Driver, p: _KernelNodeParams) -> list | None:
    """``[(offset, size)]`` of the node's kernel parameters, or None where the driver cannot say."""
    if p.func:
        get, handle = drv.func_param, p.func
    elif p.kern and drv.kernel_param is not None:
        get, handle = drv.kernel_param, p.kern
    else:
        return None
    out = []
    off, size = ctypes.c_size_t(), ctypes.c_size_t()
    while get(ctypes.c_void_p(handle), len(out), ctypes.byref(off), ctypes.byref(size)) == 0:
        out.append((off.value, size.value))
    return out


def _kernel_name(drv: _Driver, handle) -> str:
    """The name of a kernel node's function (``?`` where the driver does not say)."""
    p = _KernelNodeParams()
    name = ctypes.c_char_p()
    if drv.get_params(handle, ctypes.byref(p)) != 0 or drv.func_name is None or not p.func:
        return "?"
    if drv.func_name(ctypes.byref(name), ctypes.c_void_p(p.func)) != 0 or not name.value:
        return "?"
    return name.value.decode(errors="replace")[:60]


def _nodes(drv: _Driver, graph: int) -> list:
    n = ctypes.c_size_t(0)
    _check(drv.get_nodes(ctypes.c_void_p(graph), None, ctypes.byref(n)), "cuGraphGetNodes")
    handles = (ctypes.c_void_p * max(n.value, 1))()
    _check(drv.get_nodes(ctypes.c_void_p(graph), handles, ctypes.byref(n)), "cuGraphGetNodes")
    out = []
    for i in range(n.value):
        kind = ctypes.c_int()
        _check(drv.node_type(ctypes.c_void_p(handles[i]), ctypes.byref(kind)), "cuGraphNodeGetType")
        out.append((ctypes.c_void_p(handles[i]), kind.value))
    return out


def read_node(drv: _Driver, handle) -> tuple | None:
    """A kernel node's parameters: ``(params, layout, buf, at, words)``, its parameters copied into
    ``buf`` at ``layout``'s offsets, ``at`` the offsets of the 8-byte-aligned words inside them and
    ``words`` their values; None when the layout cannot be read."""
    p = _KernelNodeParams()
    _check(drv.get_params(handle, ctypes.byref(p)), "cuGraphKernelNodeGetParams")
    layout = _param_layout(drv, p)
    if layout is None:
        return None
    buf = ctypes.create_string_buffer(max(max((off + n for off, n in layout), default=0), 8))
    at = []
    for i, (off, n) in enumerate(layout):
        ctypes.memmove(ctypes.addressof(buf) + off, p.kernelParams[i], n)
        at += range(off + (-off % 8), off + n - 7, 8)
    return p, layout, buf, at, [struct.unpack_from("Q", buf, o)[0] for o in at]


def write_and_launch(drv: _Driver, exec_, nodes: list, slots, stream: int) -> tuple[int, str]:
    """Write the call's addresses into the kernel nodes (each word ``(offset, slot, delta)`` becomes
    ``slots[slot]``'s address plus ``delta``), then launch the graph ``exec_`` on ``stream``:
    ``(0, "")``, or the driver's error and the call that failed (nothing launched then)."""
    pack = struct.pack_into
    for node in nodes:
        buf = node.buf
        for off, slot, delta in node.words:
            pack("Q", buf, off, slots[slot].data_ptr() + delta)
        err = drv.set_params(exec_, node.handle, node.ref)
        if err:
            return err, "cuGraphExecKernelNodeSetParams"
    err = drv.launch(exec_, ctypes.c_void_p(stream))
    return err, "cuGraphLaunch" if err else ""


class GraphForm:
    """One plan captured as a CUDA graph (module docstring). ``run(inputs, replay)`` is the plan's
    ``run``: the same result, one graph launch."""

    __slots__ = ("plan", "graph", "exec", "nodes", "before", "after", "drv")

    def __init__(self, plan, graph, nodes: list, drv: _Driver):
        self.plan, self.graph, self.nodes, self.drv = plan, graph, nodes, drv
        self.exec = ctypes.c_void_p(graph.raw_cuda_graph_exec())
        self.before = [s for s in plan.steps if s.kind == "torch"]
        self.after = [s for s in plan.steps if s.kind == "host" and not s.in_graph]

    def run(self, inputs: list, replay):
        plan, before, after, nodes = self.plan, self.before, self.after, self.nodes  # retire() clears them
        slots = inputs + [None] * (plan.n_slots - plan.n_inputs)
        for step in before:  # allocations, views, fills of made tensors (the graph's own device work: checked)
            step(slots, replay)
        stream = replay.stream
        if stream is None:
            from .launcher import _current_stream

            stream = replay.stream = _current_stream()
        with _LOCK:  # the nodes' buffers are shared by every call of the plan
            err, what = write_and_launch(self.drv, self.exec, nodes, slots, stream)
        if err:  # nothing was launched: this call and the next replay the plan launch by launch
            plan.graph = False
            retire(self)
            LAST_REFUSAL[0] = f"{plan.what}: {what} failed with CUDA driver error {err}"
            return plan.run(inputs, replay)
        for step in after:  # bookkeeping: workspace use, the call's begin marks
            step(slots, replay)
        plans.STATS["replays"] += 1
        plans.STATS["relaunches"] += 1
        return plans.build_result(plan.ret, slots)


def capture(plan, inputs: list, call) -> tuple[GraphForm | None, str]:
    """Capture one replay of ``plan`` for ``inputs`` (the call ``call`` is making: nothing runs, the
    caller launches the form) and read its kernel nodes back: ``(form, "")``, or ``(None, why
    not)``."""
    if _env.interpreting():
        return None, "Triton's interpreter runs the kernels"
    if not all(t.is_cuda for t in inputs if isinstance(t, torch.Tensor)):
        return None, "a tensor of the call is not on a GPU"
    drv = driver()
    if drv is None:
        return None, "the CUDA driver's graph-node calls are missing"
    if LIVE[0] >= _MAX_FORMS:
        return None, f"{_MAX_FORMS} graph forms are live"
    try:
        graph = torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError:
        return None, "this torch cannot keep a captured graph (CUDAGraph(keep_graph=True))"
    _drop_retired(call)
    # Captured on a stream of its own, which waits for the current one; capture_begin directly, not
    # torch.cuda.graph(), which collects garbage (on this rank only: heap blocks held by cycles would
    # come back on one rank) and empties torch's cache.
    state = plans.Replay(call, None, False)  # not a user's capture: workspaces are not kept for it
    # Tensors made from nothing (torch.empty; torch.full, a fill kernel, under TILEFUSE_DEBUG_POISON)
    # are made before the capture, as every call of the form makes them before its graph launch.
    current = torch.cuda.current_stream()
    stream = _capture_stream(current.device)
    stream.wait_stream(current)
    slots = inputs + [None] * (plan.n_slots - plan.n_inputs)
    with torch.cuda.stream(stream):
        for step in plan.steps:
            if step.fresh:
                step(slots, state)
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            for step in plan.steps:
                if not step.fresh:
                    step(slots, state)
        finally:
            state.close()
            graph.capture_end()
    current.wait_stream(stream)
    graph.instantiate()
    ranges = []
    made = {}  # storage address -> bytes, of the tensors the plan made
    for s, t in enumerate(slots):
        if isinstance(t, torch.Tensor) and t.is_cuda:
            ranges.append((s, t.data_ptr(), span_bytes(t)))
            if s >= plan.n_inputs:
                made[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    made = sum(made.values())
    if made > _MAX_MADE_BYTES:
        return None, f"the plan makes {made} bytes of tensors (a graph would keep a copy)"
    nodes = _nodes(drv, graph.raw_cuda_graph())
    kernels = [h for h, kind in nodes if kind == _KERNEL_NODE]
    others = sorted({kind for _, kind in nodes if kind not in (_KERNEL_NODE, _EMPTY_NODE)})
    launches = [step for step in plan.steps if step.kind == "launch"]
    if any(step.programs == 0 for step in launches):  # a launch of no programs adds no node: the count would lie
        return None, "a launch of the plan has no programs"
    launches = len(launches)
    if others or len(kernels) != launches:
        return None, (f"the graph holds {len(kernels)} kernel nodes for {launches} launches "
                      f"({', '.join(_kernel_name(drv, h) for h in kernels)}), other node types {others}")
    form_nodes = []
    for handle in kernels:
        read = read_node(drv, handle)
        if read is None:
            return None, "a kernel node's parameter layout is unknown"
        p, layout, buf, at, words = read
        found = find_addresses(words, ranges, plan.n_inputs)
        if found is None:
            return None, "arguments overlap one another"
        if found:
            form_nodes.append(_Node(handle, p, layout, buf, [(at[i], slot, delta) for i, slot, delta in found]))
    plans.STATS["graph_forms"] += 1
    LIVE[0] += 1
    return GraphForm(plan, graph, form_nodes, drv), ""


_CAPTURE_STREAMS: dict = {}


def _capture_stream(device: torch.device):
    stream = _CAPTURE_STREAMS.get(device)
    if stream is None:
        stream = _CAPTURE_STREAMS[device] = torch.cuda.Stream(device)
    return stream


def retire(form: GraphForm) -> None:
    """``form``'s plan is cleared: destroy the graph once the device has been synchronized. Its
    steps go now: they hold the plan's constants (workspaces), which must be released on every rank
    alike."""
    LIVE[0] -= 1
    form.plan, form.before, form.after, form.nodes = None, (), (), ()
    _RETIRED.append(form)


def _drop_retired(call) -> None:
    """Destroy the retired graph forms once the device has finished every launch of them: the
    runtime's bounded wait (it gives up, raising, once a peer has exited under the work)."""
    if _RETIRED:
        from . import world

        world._wait_device(call.st or world._state(), "freeing the CUDA graphs of cleared launch plans")
        _RETIRED.clear()


def release_all() -> None:
    """Destroy the retired graph forms: at reset, shutdown and ``clear_workspaces``, each after its
    wait for the device."""
    _RETIRED.clear()
