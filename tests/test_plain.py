"""The plain path (torch.matmul + one tensor collective) against each op's reference, and what it
runs: the ops it dispatches are recorded, so an extra collective or a copy after it fails."""

import pytest
import torch
import torch.distributed as dist
from ophelpers import assert_matches
from torch.utils._python_dispatch import TorchDispatchMode

import tilefuse
from tilefuse.ops import registry

SHAPES = [(5, 7, 9), (16, 24, 40)]  # (M, N, K): ragged, and even
COPIES = ("copy_", "cat", "clone", "_to_copy", "stack", "contiguous")
COLLECTIVES = ("c10d", "collective ")
# torch.distributed's tensor collectives (tilefuse looks them up at each call)
TENSOR_COLLECTIVES = [name for name in ("all_gather_single", "all_gather_into_tensor", "reduce_scatter_single",
                                      "reduce_scatter_tensor", "all_reduce") if hasattr(dist, name)]


class Recorder(TorchDispatchMode):
    """The names of the ops a block dispatches (``aten.mm.out``, ``c10d._allgather_base_``...), and
    ``collective <name>`` for each call of the plain path's tensor collectives, inside which nothing
    is recorded (a backend's own work: gloo's reduce-scatter copies its block while it waits)."""

    def __init__(self):
        super().__init__()
        self.seen = []
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        self._saved = {name: getattr(dist, name) for name in TENSOR_COLLECTIVES}
        for name, real in self._saved.items():
            setattr(dist, name, self._counted(name, real))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, real in self._saved.items():
            setattr(dist, name, real)
        return super().__exit__(*exc)

    def _counted(self, name, real):
        def collective(*args, **kwargs):
            self.seen.append(f"collective {name}")
            self.paused = True
            try:
                return real(*args, **kwargs)
            finally:
                self.paused = False
        return collective


def _operands(ctx, op, M, N, K, dtype, seed):
    W, r = ctx.world, ctx.rank
    g = torch.Generator().manual_seed(seed if op == "gemm_all_scatter" else seed + 101 * r)  # scatter: a shared
    rows = W * M if op == "gemm_reduce_scatter" else M
    a = torch.randn(rows, K, generator=g).to(ctx.device, dtype)
    b = torch.randn(K, N, generator=g).to(ctx.device, dtype)
    return a, b


def _check_against_reference(ctx, op, M, N, K, dtype, seed):
    a, b = _operands(ctx, op, M, N, K, dtype, seed)
    plain, ref = registry.get(op, "plain"), registry.get(op, "reference")
    what = f"rank {ctx.rank}/{ctx.world} {op} {M}x{N}x{K} {dtype}"
    expected = ref(a, b)
    for name, got in (("entry", plain(a, b)), ("public", getattr(tilefuse, op)(a, b, variant="plain"))):
        assert_matches(got, expected, dtype, K, ctx.on_gpu, f"{what} plain {name}", scale=ctx.world)
    if op == "gemm_all_scatter":  # out=: column-major (the gather's own buffer) and row-major (one copy)
        for out in (torch.empty(ctx.world * N, M, dtype=dtype, device=ctx.device).t(),
                    torch.full((M, ctx.world * N), float("nan"), dtype=dtype, device=ctx.device)):
            got = plain(a, b, out=out)
            assert got.data_ptr() == out.data_ptr() and got.shape == out.shape, f"{what}: not written into out"
            assert_matches(out, expected, dtype, K, ctx.on_gpu, f"{what} out= strides {out.stride()}")
    if op == "all_gather_gemm":
        c, gathered = plain(a, b, return_gathered=True)
        full_a = registry.get(op, "reference")(a, torch.eye(K, dtype=dtype, device=ctx.device))
        assert torch.equal(gathered, full_a), f"{what}: gathered a"
        assert_matches(c, expected, dtype, K, ctx.on_gpu, f"{what} return_gathered")
    if op == "gemm_all_reduce":
        bias = torch.randn(N, generator=torch.Generator().manual_seed(seed)).to(ctx.device, dtype)
        assert_matches(plain(a, b, bias=bias), expected + bias, dtype, K, ctx.on_gpu, f"{what} bias",
                       scale=ctx.world)


def _recorded(fn) -> list:
    with Recorder() as rec:
        fn()
    return rec.seen


def _check_calls(ctx, op, M, N, K):
    """What the plain path dispatches: one collective (none at W = 1) and no copy anywhere, the matmul
    writing straight into the gather's buffer (gemm_all_scatter), a row-major out= one copy."""
    a, b = _operands(ctx, op, M, N, K, torch.float32, 7)
    plain = registry.get(op, "plain")
    what = f"rank {ctx.rank}/{ctx.world} {op}"
    seen = _recorded(lambda: plain(a, b))
    collectives = [s for s in seen if any(c in s for c in COLLECTIVES)]
    copies = [s for s in seen if any(f"aten.{c}." in s for c in COPIES)]
    mms = [s for s in seen if s.startswith(("aten.mm", "aten.addmm", "aten.matmul"))]
    assert len(collectives) == (0 if ctx.world == 1 else 1), f"{what}: collectives {collectives} in {seen}"
    # gloo carries a GPU tensor's collective through host memory (a copy out, a copy back): the copy
    # checks hold where the collective runs where the tensors are (CPU ranks, NCCL).
    staged = ctx.world > 1 and a.is_cuda and dist.get_backend() == "gloo"
    if staged:
        copies = [s for s in copies if s not in ("aten._to_copy.default", "aten.copy_.default")]
    assert not copies, f"{what}: copies {copies} in {seen}"
    assert len(mms) == 1, f"{what}: matmuls {mms} in {seen}"
    if op == "gemm_all_scatter" and ctx.world > 1 and not staged:
        assert mms[0] == "aten.mm.out", f"{what}: the matmul does not write into the gather's buffer: {seen}"
        row_major = torch.empty(M, ctx.world * N, device=ctx.device)
        seen = _recorded(lambda: plain(a, b, out=row_major))
        assert [s for s in seen if "copy_" in s] == ["aten.copy_.default"], f"{what} row-major out: {seen}"
        col_major = torch.empty(ctx.world * N, M, device=ctx.device).t()
        seen = _recorded(lambda: plain(a, b, out=col_major))
        assert not [s for s in seen if any(f"aten.{c}." in s for c in COPIES)], f"{what} column-major out: {seen}"
    if op == "gemm_all_reduce":  # with a bias: nn.Linear's addmm at W = 1, the sum then one add
        bias = torch.zeros(N, device=ctx.device)
        seen = _recorded(lambda: plain(a, b, bias=bias))
        want = ["aten.addmm.default"] if ctx.world == 1 else ["aten.mm.default", "aten.add_.Tensor"]
        assert [s for s in seen if s.startswith(("aten.mm", "aten.addmm", "aten.add"))] == want, f"{what}: {seen}"


def _check_auto_runs_plain_directly(ctx, op, M, N, K):
    """An eager auto call whose bucket chose plain (nothing measured here) is one lookup, then the plain
    entry point: no decision made again, not through the custom op (whose implementation runs
    ``library.run``), the plain entry point called once (at W = 1 the matmul itself, with no entry
    point around it: :func:`tilefuse.ops.plain.direct`)."""
    from tilefuse.ops import dispatch, library

    a, b = _operands(ctx, op, M, N, K, torch.float32, 8)
    public, plain = getattr(tilefuse, op), registry.get(op, "plain")
    public(a, b)  # the bucket's first call decides (collectively)
    assert dispatch.choose(op, a, b).variant == "plain"
    calls = []

    def refuse(*args, **kwargs):
        raise AssertionError(f"{op}: an eager auto call went through a decision or the custom op")

    def counting(fn):
        def counted(*args, **kwargs):
            calls.append(1)
            return fn(*args, **kwargs)
        return counted

    hits = [v for v in dispatch._RESOLVED.values() if v[1] is plain]
    assert hits and all((v[3] is not None) == (ctx.world == 1) for v in hits), f"{op}: direct {hits}"
    saved = dispatch.resolve, library.run
    dispatch.resolve = library.run = refuse
    try:
        dispatch._RESOLVED.update({k: (v[0], counting(v[1]), v[2], v[3] and counting(v[3]), v[4])
                                   for k, v in dispatch._RESOLVED.items() if v[1] is plain})
        got = public(a, b)
    finally:
        dispatch.resolve, library.run = saved
        dispatch.clear()
    assert calls == [1] and torch.equal(got, plain(a, b)), f"rank {ctx.rank} {op}: plain entry calls {calls}"


def job_plain(ctx):
    for op in registry.OPS:
        for i, (M, N, K) in enumerate(SHAPES):
            for dtype in (torch.float32, torch.float16):
                _check_against_reference(ctx, op, M, N, K, dtype, seed=10 * i)
        _check_calls(ctx, op, *SHAPES[0])
        _check_auto_runs_plain_directly(ctx, op, *SHAPES[1])
    return True


@pytest.mark.parametrize("world", [1, 2, 3])
def test_plain_matches_reference_with_one_collective_and_no_copy(pools, world):
    assert all(pools.run(world, job_plain))


def job_plain_errors(ctx):
    """Errors name the op and the argument, whether the plain path or torch.matmul finds them."""
    plain = registry.get("all_gather_gemm", "plain")
    a = torch.randn(4, 8, device=ctx.device)
    cases = [((a, torch.randn(6, 3, device=ctx.device)), ValueError, "all_gather_gemm: b has 6 rows but a has 8"),
             ((a, torch.randn(8, 3, device=ctx.device).half()), TypeError, "b has dtype torch.float16"),
             ((a.double(), torch.randn(8, 3, device=ctx.device).double()), TypeError, "supported dtypes"),
             ((a[0], torch.randn(8, 3, device=ctx.device)), ValueError, "a must be a 2-D matrix"),
             (([[1.0]], torch.randn(8, 3, device=ctx.device)), TypeError, "a must be a torch.Tensor")]
    for args, exc, match in cases:
        with pytest.raises(exc, match=match):
            plain(*args)
    with pytest.raises(ValueError, match=r"gemm_reduce_scatter: M \(rows of a\) = 3 must be divisible"):
        registry.get("gemm_reduce_scatter", "plain")(torch.randn(3, 8), torch.randn(8, 3))
    return True


def test_plain_errors_name_the_op(pools):
    assert all(pools.run(2, job_plain_errors))
