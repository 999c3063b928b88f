"""Several process groups in one process: a heap and a protocol state per group.

W = 4 ranks (the pools' world group is the default one) with the pairs {0, 1} and {2, 3} and the
crossed pairs {0, 2} and {1, 3} (so every rank is in three groups): every op, one fused variant, the
plain path and auto, called on this rank's pair, its crossed pair and the world group in turn,
against a torch reference computed on every rank from every group rank's seeded operands (each
group's operands differ, so a call that reads another group's buffers fails); the pair's
workspaces live on its own heap, and ``reset``/``clear_workspaces`` of the pair leave the
world's state alone. A 2 x 2 (dp x tp) DeviceMesh with tilefuse's styles on the tp dimension against
torch's styles, while tilefuse also serves the world. An op on a group that was never initialised
raises on every rank, naming the remedy, and the world's calls go on.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.distributed as dist
from ophelpers import assert_matches
from torch import nn

import tilefuse
from tilefuse.ops import registry
from tilefuse.ops.common import arena
from tilefuse.runtime import primitives, world

W = 4
PAIRS = ([0, 1], [2, 3])
CROSSED = ([0, 2], [1, 3])
# One fused variant per op (flagged and barrier-ordered ones both), then the plain path.
FUSED = {"gemm_all_scatter": "wg_specialized", "all_gather_gemm": "producer_consumer",
         "gemm_reduce_scatter": "fused_sequential", "gemm_all_reduce": "fused_sequential"}
# (M, N, K) per rank, ragged; M a multiple of 4 where gemm_reduce_scatter splits it.
SHAPE = (20, 24, 40)
DTYPE = torch.float32
PAIR_HEAP = 8 << 20


@contextlib.contextmanager
def _pairs(ctx, init: bool = True):
    """This rank's pair and crossed pair (made on every rank: new_group is collective over the
    world), each initialised with a heap of its own unless ``init`` is False; shut down and
    destroyed after."""
    pair = [dist.new_group(ranks) for ranks in PAIRS][ctx.rank // 2]
    cross = [dist.new_group(ranks) for ranks in CROSSED][ctx.rank % 2]
    try:
        if init:
            for g, rank in ((pair, ctx.rank % 2), (cross, ctx.rank // 2)):
                heap = tilefuse.init(heap_size=PAIR_HEAP, group=g)
                assert heap.group is g and heap.world_size == 2 and heap.rank == rank
        yield pair, cross
    finally:
        for g in (cross, pair):
            if init:
                tilefuse.shutdown(group=g)
            dist.destroy_process_group(g)


def _randn(shape, seed: int, scale: float = 1.0, device=None) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(DTYPE).to(device or "cpu")


def _device() -> torch.device:
    """Where this rank's operands go: the default heap's device (the CPU without a heap)."""
    return tilefuse.get_heap().device if tilefuse.is_initialized() else torch.device("cpu")


def _operands(op: str, world_size: int, seed: int, device=None) -> list:
    """``(a, b)`` of every group rank for one call of ``op`` (rank r's A scaled by r + 1), on
    ``device`` (default: the CPU, where the reference is computed)."""
    M, N, K = SHAPE
    shared_a, shared_b = _randn((M, K), seed, device=device), _randn((K, N), seed + 1, device=device)
    out = []
    for r in range(world_size):
        s = seed + 10 * (r + 1)
        if op == "gemm_all_scatter":  # a replicated, b this rank's column shard
            out.append((shared_a, _randn((K, N), s, device=device)))
        elif op == "all_gather_gemm":  # a this rank's row shard, b replicated
            out.append((_randn((M, K), s, r + 1, device=device), shared_b))
        else:  # a and b this rank's K shard
            out.append((_randn((M, K), s, r + 1, device=device), _randn((K, N), s + 1, device=device)))
    return out


def _reference(op: str, operands: list, rank: int) -> torch.Tensor:
    prods = [a.double() @ b.double() for a, b in operands]
    if op == "gemm_all_scatter":
        ref = torch.cat(prods, dim=1)
    elif op == "all_gather_gemm":
        ref = torch.cat([a for a, _ in operands]).double() @ operands[0][1].double()
    else:
        ref = sum(prods)
        if op == "gemm_reduce_scatter":
            rows = ref.shape[0] // len(operands)
            ref = ref[rank * rows:(rank + 1) * rows]
    return ref.to(DTYPE)


def _poison_all(ctx) -> None:
    """NaN in every float workspace and stale sequence numbers in every flag buffer, of every heap
    (barriers on the world around it: every rank's earlier work is done, nobody reads meanwhile)."""
    tilefuse.barrier()
    for grp in world.groups():
        heap = tilefuse.get_heap(grp)
        with world.using(grp):
            seq = int(tilefuse.runtime.control_block()[int(primitives.CTL_SEQ)].item())
        for ws in arena.workspaces(heap):
            for name, buf in ws.buffers.items():
                if buf.dtype.is_floating_point:
                    buf.fill_(float("nan"))
                elif name.startswith("flags"):
                    buf.fill_(seq - 7)  # any value but the next call's is stale
    tilefuse.barrier()


def _call(op: str, variant: str, group, seed: int, rank: int, world_size: int, custom_op: bool = False):
    a, b = _operands(op, world_size, seed, _device())[rank]
    if custom_op:  # what traced code and autograd run: the group travels as its name
        name = None if group is None else group.group_name
        return getattr(torch.ops.tilefuse, op)(a, b, variant, None, name)
    return getattr(tilefuse, op)(a, b, variant=variant, group=group)


def _check(op: str, got, group, seed: int, what: str) -> None:
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    ref = _reference(op, _operands(op, size, seed), rank)
    K = SHAPE[2] * (size if op in ("gemm_reduce_scatter", "gemm_all_reduce") else 1)
    assert_matches(got.cpu(), ref, DTYPE, K, got.is_cuda, what, scale=size * (size + 1) / 2)


def job_interleaved(ctx):
    """Every op on this rank's pair and on the world in turn; workspaces and reset per group."""
    assert ctx.world == W
    default = tilefuse.get_heap()
    with _pairs(ctx) as (pair, cross):
        assert tilefuse.get_heap() is default, "the first group initialised stays the default"
        assert world.groups()[0] is default.group and pair in world.groups() and cross in world.groups()
        assert tilefuse.init(group=pair) is tilefuse.get_heap(pair), "init is idempotent per group"
        assert tilefuse.is_initialized(pair) and tilefuse.is_initialized(pair.group_name)
        sub_heap = tilefuse.get_heap(pair)
        for op_i, op in enumerate(FUSED):
            # Three calls of the fused variant, then the plain path and auto; pair, crossed pair and
            # world take turns, the world's group passed as None, as the WORLD object, or by name through the custom op.
            steps = [(FUSED[op], i) for i in range(3)] + [("plain", 3), ("auto", 4)]
            for variant, i in steps:
                seed = 1000 * op_i + 100 * i
                _poison_all(ctx)
                got = _call(op, variant, pair, seed + 1, ctx.rank % 2, 2, custom_op=(i == 2))
                _check(op, got, pair, seed + 1, f"{op} {variant} call {i} on the pair")
                got = _call(op, variant, cross, seed + 3, ctx.rank // 2, 2)
                _check(op, got, cross, seed + 3, f"{op} {variant} call {i} on the crossed pair")
                wgroup = (None, dist.group.WORLD)[i % 2]
                got = _call(op, variant, wgroup, seed + 2, ctx.rank, W, custom_op=(i == 1))
                _check(op, got, dist.group.WORLD, seed + 2, f"{op} {variant} call {i} on the world")
        # Repeated calls of one signature on the pair run on the pair's state.
        entry = registry.get("gemm_all_reduce", "fused_sequential")
        a, b = _operands("gemm_all_reduce", 2, 3, _device())[ctx.rank % 2]
        for i in range(3):
            _check("gemm_all_reduce", entry(a, b, group=pair), pair, 3, f"pair call {i} of one signature")
        sub_bytes, world_bytes = arena.workspace_bytes(sub_heap), arena.workspace_bytes(default)
        assert sub_bytes > 0 and world_bytes > 0, (sub_bytes, world_bytes)
        assert all(sub_heap.is_on_heap(b) for ws in arena.workspaces(sub_heap) for b in ws.buffers.values())

        # reset and clear_workspaces act on the group given: the world's workspaces stay.
        tilefuse.reset(group=pair)
        assert arena.workspace_bytes(sub_heap) == 0 and arena.workspace_bytes(default) == world_bytes
        got = _call("gemm_all_reduce", "fused_sequential", pair, 7, ctx.rank % 2, 2)
        _check("gemm_all_reduce", got, pair, 7, "gemm_all_reduce on the pair after its reset")
        tilefuse.clear_workspaces(group=pair)
        assert arena.workspace_bytes(sub_heap) == 0 and arena.workspace_bytes(default) == world_bytes
        got = _call("gemm_all_reduce", "fused_sequential", None, 8, ctx.rank, W)
        _check("gemm_all_reduce", got, dist.group.WORLD, 8, "gemm_all_reduce on the world after the pair's reset")

        # Heap tensors of a group, and the default group that stays until the others are shut down.
        t = tilefuse.zeros(4, 4, group=pair)
        assert tilefuse.is_on_heap(t, group=pair) and not tilefuse.is_on_heap(t)
        del t
        with pytest.raises(ValueError, match="is the default group; shut the other groups down first"):
            tilefuse.shutdown(group=default.group)
    assert not tilefuse.is_initialized(pair) and not tilefuse.is_initialized(cross) and pair not in world.groups()
    assert tilefuse.get_heap() is default and not arena.workspaces(sub_heap), "the pair's workspaces outlived it"
    return True


@pytest.mark.slow
def test_ops_on_several_groups_interleaved(pools):
    """Pairs and crossed pairs beside the world group: every op, fused, plain and auto, interleaved."""
    assert all(pools.run(W, job_interleaved))


def job_uninitialised(ctx):
    """Every rank calls ops on its pair, which nobody initialised: each raises, naming the remedy."""
    with _pairs(ctx, init=False) as (pair, _):
        assert not tilefuse.is_initialized(pair)
        a, b = _operands("gemm_all_reduce", 2, 5, _device())[ctx.rank % 2]
        remedy = r"not initialised for process group '.*' \(ranks \[\d, \d\]\) on global rank \d: call " \
                 r"tilefuse\.init\(group=\.\.\.\)"
        for variant in ("fused_sequential", "auto"):
            with pytest.raises(RuntimeError, match=remedy):
                tilefuse.gemm_all_reduce(a, b, variant=variant, group=pair)
        with pytest.raises(RuntimeError, match=remedy):
            torch.ops.tilefuse.gemm_all_scatter(a, b, "bulk_sync", None, pair.group_name)
        for fn in (tilefuse.reset, tilefuse.clear_workspaces, tilefuse.get_heap):
            with pytest.raises(RuntimeError, match=remedy):
                fn(group=pair)
        # A rank outside a group cannot initialise it.
        other = dist.new_group(PAIRS[0])  # collective over the world; ranks 2 and 3 are not members
        if ctx.rank >= 2:
            with pytest.raises(ValueError, match=r"global rank \d is not a member of this process group"):
                tilefuse.init(group=other)
        else:
            dist.destroy_process_group(other)
        # Nothing was paired on the world: its calls go on.
        got = _call("gemm_all_reduce", "fused_sequential", None, 9, ctx.rank, W)
        _check("gemm_all_reduce", got, dist.group.WORLD, 9, "gemm_all_reduce on the world after the errors")
    return True


def test_uninitialised_group_errors_on_every_rank(pools):
    assert all(pools.run(W, job_uninitialised))


class _Pair(nn.Module):
    def __init__(self, h: int, f: int):
        super().__init__()
        self.up, self.down = nn.Linear(h, f), nn.Linear(f, h)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def job_dp_tp_mesh(ctx):
    """A 2 x 2 (dp x tp) mesh while tilefuse serves the world: tilefuse's styles on the mesh (its tp
    dimension) initialise the TP pair's heap; output and every gradient against torch's styles."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel as TorchColwise
    from torch.distributed.tensor.parallel import RowwiseParallel as TorchRowwise
    from torch.distributed.tensor.parallel import parallelize_module

    from tilefuse.nn import ColwiseParallel, RowwiseParallel

    default = tilefuse.get_heap()
    mesh = init_device_mesh(ctx.device.type, (2, 2), mesh_dim_names=("dp", "tp"))
    tp_mesh, dp = mesh["tp"], mesh.get_local_rank("dp")
    tp_group = tp_mesh.get_group()
    assert not tilefuse.is_initialized(tp_group)
    torch.manual_seed(4)
    full = _Pair(16, 32).to(ctx.device)
    ours = parallelize_module(copy.deepcopy(full), mesh, {"up": ColwiseParallel(variant="fused_sequential"),
                                                        "down": RowwiseParallel(variant="fused_sequential")})
    theirs = parallelize_module(copy.deepcopy(full), tp_mesh, {"up": TorchColwise(), "down": TorchRowwise()})
    try:
        heap = tilefuse.get_heap(tp_group)
        assert tilefuse.get_heap() is default, "the world stays the default group"
        assert heap.world_size == 2 and heap.size == default.size
        assert dist.get_process_group_ranks(heap.group) == [2 * dp, 2 * dp + 1]
        errs = []
        for step in range(2):  # a second step: the pair's workspaces are reused
            x = _randn((6, 16), 100 * step + dp).to(ctx.device)  # this replica's data
            x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
            y_ours, y_theirs = ours(x_ours), theirs(x_theirs)
            (y_ours * (1 + dp)).sum().backward()
            (y_theirs * (1 + dp)).sum().backward()
            errs += [float((y_ours - y_theirs).detach().abs().max()), float((x_ours.grad - x_theirs.grad).abs().max())]
            for name in ("up.weight", "up.bias", "down.weight", "down.bias"):
                p_ours, p_theirs = ours.get_parameter(name), theirs.get_parameter(name)
                assert p_ours.placements == p_theirs.placements, name
                errs.append(float((p_ours.grad.to_local() - p_theirs.grad.to_local()).abs().max()))
            ours.zero_grad()
            theirs.zero_grad()
        assert arena.workspaces(heap), "the styles' ops ran on the TP pair's heap"
        got = _call("all_gather_gemm", "producer_consumer", None, 11, ctx.rank, W)
        _check("all_gather_gemm", got, dist.group.WORLD, 11, "all_gather_gemm on the world beside the mesh")
    finally:
        ours = theirs = None
        tilefuse.shutdown(group=tp_group)
    return errs


def test_dp_tp_mesh_matches_torch_styles(pools, on_gpu):
    bound = 3e-2 if on_gpu else 1e-4  # on a GPU tilefuse's fp32 products use TF32, torch's by default do not
    for rank, errs in enumerate(pools.run(W, job_dp_tp_mesh)):
        assert max(errs) < bound, f"rank {rank}: max errors (y, dx, then parameter grads) {errs}"


def test_every_op_has_the_fused_variant():
    for op, variant in FUSED.items():
        assert variant in registry.variants(op), (op, variant)


def _subgroup_default_job(rank, world):
    """tilefuse initialised first on this rank's pair, so the pair is its default group: the plain
    and reference paths with ``group=None`` reduce over the pair (as the fused variants do), not
    over torch's default (the whole world)."""
    pair = [dist.new_group(ranks) for ranks in PAIRS][rank // 2]
    tilefuse.init(heap_size=PAIR_HEAP, group=pair)
    try:
        me = rank % 2
        got = {}
        for op in ("gemm_reduce_scatter", "gemm_all_reduce", "all_gather_gemm", "gemm_all_scatter"):
            a, b = _operands(op, 2, 100 + 7 * (rank // 2), _device())[me]
            ref = registry.get(op, "reference")(a, b)
            for v in ("plain", FUSED[op]):
                c = getattr(tilefuse, op)(a, b, variant=v)
                got[(op, v)] = float((c.float() - ref.float()).norm() / ref.float().norm())
        return got, a.is_cuda
    finally:
        tilefuse.shutdown()
        dist.destroy_process_group(pair)


@pytest.mark.slow
def test_torch_collective_paths_follow_the_default_group():
    from harness import run_group

    res = run_group(_subgroup_default_job, W, timeout=180)
    for rank, (status, value) in sorted(res.items()):
        assert status == "ok", (rank, status, value)
        errs, on_gpu = value
        for key, err in errs.items():
            assert err < (5e-3 if on_gpu else 1e-4), (rank, key, err)  # TF32 on a GPU
