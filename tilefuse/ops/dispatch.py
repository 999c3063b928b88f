"""``variant="auto"``: a measured choice where there is one, else the plain path. A call is decided per
bucket (:func:`tilefuse.tuning.tables.m_bucket`) on its first call, collectively, from the first of: a config
table entry, the user's decision cache, first-call tuning, the cost model, the plain path (the order and
settings: tilefuse/tuning/README.md). Decisions are remembered per bucket and call signature; while
torch.compile traces or a CUDA graph captures, an undecided bucket runs plain. Logger ``tilefuse``.
"""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist

from ..runtime import _env, get_heap, hw, is_initialized
from ..runtime.world import on_shutdown
from ..tuning import autotune, cache, costmodel, rules, tables
from ..tuning.tables import bucket_name, m_bucket
from . import plain, registry

log = logging.getLogger("tilefuse")


def _times_mean_something(device: torch.device) -> bool:
    """Whether the default mode may tune here: on a GPU, not in Triton's interpreter."""
    return device.type == "cuda"


def _default(why: str) -> tables.Choice:
    return tables.Choice(tables.PLAIN, None, f"default ({why})")


def _local_view(op: str, arch: str, world: int, M: int, N: int, K: int, dtype: str) -> tables.Choice | None:
    """This rank's table or cache entry for the call's bucket (no communication)."""
    choice = tables.lookup(op, arch, world, M, N, K, dtype)
    if choice is not None and choice.variant in registry.variants(op):
        return choice
    key = cache.entry_key(arch, world, op, dtype, N, K, m_bucket(M))
    hit = cache.decision(key, op, registry.variants(op), hw.num_sms(get_heap().device) if is_initialized() else None)
    if hit is not None:  # (an unusable cache or entry is warned about and passed over)
        e, cfg = hit
        return tables.Choice(e["variant"], cfg, f"cache {cache.cache_path()} [{key}]", tables.graph_of(e))
    return None


def _model_view(op: str, arch: str, world: int, M: int, N: int, K: int, dtype: str) -> tables.Choice | None:
    p = costmodel.predict(op, arch, world, M, N, K, dtype)
    if p is None or not p.wins or p.variant not in registry.variants(op):
        return None
    return tables.Choice(p.variant, p.config, f"model (predicted {p.speedup:.2f}x plain from {list(p.neighbours)})")


def choose(op: str, a, b, group=None) -> tables.Choice:
    """What auto runs (or would run) for ``op(a, b)``, without communicating."""
    grp, arch, world, dtype, M, N, K, bkey = _call_facts(op, a, b, group)
    return (_BUCKETS.get(bkey) or _local_view(op, arch, world, M, N, K, dtype)
            or _model_view(op, arch, world, M, N, K, dtype) or _default("nothing measured"))


_BUCKETS: dict = {}  # bucket key -> Choice, made collectively (the same on every rank)
_RESOLVED: dict = {}  # call signature -> (variant, entry point, config)
_dirs = _env.env_reader("TILEFUSE_CONFIG_DIR", "TILEFUSE_CACHE_DIR")
_generation = tables.generation
# Auto's per-call key holds the two directory settings as the environment stores them (a third of
# _dirs()'s cost; the key only compares them).
if isinstance(getattr(os.environ, "_data", None), dict) and hasattr(os.environ, "encodekey"):
    _env_get = os.environ._data.get
    _CONFIG_DIR, _CACHE_DIR = (os.environ.encodekey(n) for n in ("TILEFUSE_CONFIG_DIR", "TILEFUSE_CACHE_DIR"))
else:
    _env_get, _CONFIG_DIR, _CACHE_DIR = os.environ.get, "TILEFUSE_CONFIG_DIR", "TILEFUSE_CACHE_DIR"


def clear() -> None:
    """Forget every decision made in this process (collective by convention); the disk cache stays."""
    _BUCKETS.clear()
    _RESOLVED.clear()


on_shutdown(_RESOLVED.clear)  # its keys leave the heap out: a later heap starts from the buckets


def _call_facts(op: str, a, b, group) -> tuple:
    """``(group, arch, world, dtype name, M, N, K, bucket key)`` of a call ``op(a, b)``."""
    if not is_initialized():
        raise RuntimeError(f"{op}: tilefuse is not initialised on this rank: call tilefuse.init() first")
    heap = get_heap(group)  # the group's own heap (a clear error if it was never initialised)
    grp = group if group is not None else heap.group
    world = dist.get_world_size(grp)
    (M, K), N = a.shape, b.shape[1]
    dtype, arch = str(a.dtype).removeprefix("torch."), hw.arch_name(heap.device)
    bkey = (op, arch, world, dtype, N, K, m_bucket(M), grp, heap.uid, _dirs(), tables.generation())
    return grp, arch, world, dtype, M, N, K, bkey


def _candidates(op: str, a, b, grp, kwargs: dict, model: tables.Choice | None) -> list:
    bind = lambda fn, **kw: lambda: fn(a, b, group=grp, **kw, **kwargs)
    world, variants = get_heap(grp).world_size, registry.variants(op)
    out = [autotune.Candidate("plain", tables.PLAIN, None, bind(variants[tables.PLAIN]))]
    for variant in registry.tunable(op):
        if variant in variants and rules.skip_reason(op, variant, b.shape[1], world) is None:
            out.append(autotune.Candidate(variant, variant, None, bind(variants[variant], config=None)))
    if model is not None and model.config is not None and model.variant in variants:
        out.append(autotune.Candidate(f"{model.variant}#model", model.variant, model.config,
                                      bind(variants[model.variant], config=model.config)))
    return out


def _tune(op, a, b, grp, kwargs, arch, world, dtype, M, N, K, model) -> tables.Choice:
    # The exchanges' step name leaves K out: a gemm_all_reduce's K shards may differ between ranks.
    bucket = bucket_name(m_bucket(M))
    what = f"{op} {M}x{N}x{K} {dtype} W={world} {bucket}"
    res = autotune.tune(_candidates(op, a, b, grp, kwargs, model), device=a.device, group=grp,
                        what=f"{op} N={N} {dtype} W={world} {bucket}")
    times = ", ".join(f"{n} {t:.4g} ms" for n, t in res.times.items())
    dropped = "; ".join(f"{n}: {why}" for n, why in res.dropped.items())
    log.info("tilefuse: tuned %s: %s (median of %d interleaved calls, max over ranks) -> %s%s", what, times,
             res.reps, res.variant, f"; dropped {dropped}" if dropped else "")
    key = cache.entry_key(arch, world, op, dtype, N, K, m_bucket(M))
    entry = {"variant": res.variant, "config": None if res.config is None else res.config.to_dict(),
             "M": M, "times_ms": res.times, "margin": autotune.MARGIN}
    graph = None
    if res.device:  # device time was measured: the graph pick is recorded, the same as the eager one or not
        graph = (res.graph_variant, res.graph_config)
        entry["graph"] = {"variant": res.graph_variant, "config": res.graph_config and res.graph_config.to_dict(),
                          "device_ms": res.device}
        if res.graph_confirmed is not None:
            entry["graph"]["confirm_device_ms"] = res.graph_confirmed["device"]
    try:
        path = cache.put({key: entry})
        source = f"tuned (saved in {path})"
    except OSError as err:  # a read-only home, a full disk: the decision still holds for this process
        log.warning("tilefuse: could not save the tuning result of %s in the autotune cache: %s", what, err)
        source = "tuned (not saved)"
    return tables.Choice(res.variant, res.config, source, graph)


def _decide(op: str, a, b, group, kwargs) -> tuple[tables.Choice, bool]:
    """``(choice, remembered)``: the bucket's decision for ``op(a, b, **kwargs)``, made collectively on its
    first call; a call under capture or tracing gets plain, not remembered."""
    grp, arch, world, dtype, M, N, K, bkey = _call_facts(op, a, b, group)
    hit = _BUCKETS.get(bkey)
    if hit is not None:
        return hit, True
    if torch.compiler.is_compiling() or (a.is_cuda and torch.cuda.is_current_stream_capturing()):
        return _default("capturing or compiling: no exchange, no tuning"), False
    try:
        mine = {"view": _local_view(op, arch, world, M, N, K, dtype),
                "model": _model_view(op, arch, world, M, N, K, dtype), "mode": _env.autotune_mode(), "error": None}
    except (ValueError, OSError) as err:  # a malformed table, a bad setting: every rank raises, none waits
        mine = {"error": f"{type(err).__name__}: {err}"}
    views = autotune.all_gather(mine, grp, what=f"auto {op}: decision views")
    for r, v in enumerate(views):
        if v["error"]:
            raise RuntimeError(f"{op}: variant='auto' cannot decide: rank {r}: {v['error']}")
    lead = views[0]
    if any(v["view"] != lead["view"] for v in views[1:]):
        log.debug("tilefuse: auto %s %dx%dx%d: the ranks' tables/caches differ; rank 0's view wins: %s",
                  op, M, N, K, [v["view"] and v["view"].variant for v in views])
    choice = lead["view"]
    if choice is None and lead["mode"] != "0":
        tune = lead["mode"] == "1"
        if not tune and _times_mean_something(a.device):
            plain = registry.get(op, tables.PLAIN)
            plain_ms = autotune.time_plain(lambda: plain(a, b, group=grp, **(kwargs or {})), a.device, grp)
            tune = plain_ms >= autotune.MIN_PLAIN_MS
            if not tune:
                log.debug("tilefuse: auto %s %dx%dx%d: plain takes %.3g ms < %.3g ms: not tuned", op, M, N, K,
                          plain_ms, autotune.MIN_PLAIN_MS)
        if tune:
            choice = _tune(op, a, b, grp, kwargs or {}, arch, world, dtype, M, N, K, lead["model"])
    if choice is None:
        choice = lead["model"] or _default("nothing measured")
    _BUCKETS[bkey] = choice
    log.debug("tilefuse: auto %s %dx%dx%d %s W=%d %s -> %s (%s)", op, M, N, K, dtype, world,
              bucket_name(m_bucket(M)), choice.variant, choice.source)
    return choice, True


_graph_capture = torch._C._cuda_isCurrentStreamCapturing  # torch.cuda.is_current_stream_capturing, one frame less
GRAPH_MIN_M = 512  # below it, a fused choice with no device-time measurement runs plain inside CUDA graphs


def _for_graphs(choice: tables.Choice, M: int) -> tables.Choice:
    """What runs inside a CUDA graph: the measured graph pick, else the choice from ``GRAPH_MIN_M`` rows,
    else plain (a fused variant's eager win at small M is mostly host work, which a graph does not pay)."""
    if choice.graph is not None or choice.variant == tables.PLAIN or M >= GRAPH_MIN_M:
        return choice.for_graphs()
    return tables.Choice(tables.PLAIN, None, f"{choice.source}; inside CUDA graphs plain: M < {GRAPH_MIN_M} and no "
                         "device-time measurement")


def _hit(op: str, a, group, choice: tables.Choice) -> tuple:
    """``(variant, entry point, config, direct)`` of ``choice``."""
    direct = plain.direct(op, a, group) if choice.variant == tables.PLAIN else None
    return choice.variant, registry.get(op, choice.variant), choice.config, direct


def resolve(op: str, a, b, group, kwargs, graphs: bool | None = None) -> tuple:
    """``(variant, entry point, config, direct, remembered)``: what auto runs for this call (remembered per
    call signature), the matmul where plain at W = 1 is the call (:func:`.plain.direct`), and whether it
    is remembered; ``graphs``: the choice for CUDA graphs (None: whether the current stream captures)."""
    if graphs is None:
        graphs = a.is_cuda and _graph_capture()
    # run_auto makes the same key
    key = (op, a.shape, b.shape, a.dtype, group, _generation(), _env_get(_CONFIG_DIR), _env_get(_CACHE_DIR))
    hit = _RESOLVED.get(key)
    remembered = hit is not None
    if hit is None:
        choice, remembered = _decide(op, a, b, group, kwargs)
        eager, in_graphs = _hit(op, a, group, choice), _hit(op, a, group, _for_graphs(choice, a.shape[0]))
        hit = (*eager, None if in_graphs[:3] == eager[:3] else in_graphs)  # (None: the same inside graphs)
        if remembered:
            if len(_RESOLVED) >= 4096:  # exact shapes of a server's ever-changing token counts: stay bounded
                _RESOLVED.clear()
            _RESOLVED[key] = hit
    if graphs and hit[4] is not None:
        hit = hit[4]
    return (*hit[:4], remembered)


def run_auto(op: str, a, b, config, group, **kwargs):
    """Run ``op`` with the chosen variant (a caller's ``config`` wins): one lookup for a signature seen
    before (its key leaves the device out: one heap device per process), and a query of the stream's
    capture only where the choice inside CUDA graphs differs."""
    hit = _RESOLVED.get((op, a.shape, b.shape, a.dtype, group, _generation(), _env_get(_CONFIG_DIR),
                         _env_get(_CACHE_DIR)))
    if hit is None:
        hit = resolve(op, a, b, group, kwargs)
    elif hit[4] is not None and a.is_cuda and _graph_capture():
        hit = hit[4]
    if kwargs:
        return hit[1](a, b, config=hit[2] if config is None else config, group=group, **kwargs)
    if config is None:
        if hit[3] is not None:  # plain at W = 1: the matmul itself
            return hit[3](a, b)
        config = hit[2]
    return hit[1](a, b, config=config, group=group)  # (a call with **{} would build a dictionary)
