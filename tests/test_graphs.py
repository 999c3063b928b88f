"""CUDA graphs: every op x variant captured after one eager call, replayed with new inputs copied into
the static inputs, every replay checked against the reference; capture on torch's capture stream and
on a user side stream; replays after clear_workspaces() abort and raise at the next check; two-stream
eager calls. GPU only (the interpreter has no graphs)."""

import functools

import pytest
import torch
from ophelpers import randn

import tilefuse
from tilefuse.ops import registry

OPS = ("gemm_all_scatter", "all_gather_gemm", "gemm_reduce_scatter")
VARIANTS = ("bulk_sync", "producer_consumer", "fused_sequential", "wg_specialized")


def _shapes(op, world):
    rows, n, k = 72, 136, 96  # ragged against the 64/128 blocks
    m = rows * world if op == "gemm_reduce_scatter" else rows
    return (m, k), (k, n)


def _fresh(ctx, op, seed, dtype=torch.bfloat16):
    sa, sb = _shapes(op, ctx.world)
    a = randn(sa, dtype, ctx.device, seed=seed * 10 + (0 if op == "gemm_all_scatter" else ctx.rank))
    b = randn(sb, dtype, ctx.device, seed=seed * 10 + 5 + ctx.rank)
    return a, b


def _close(got, ref, what):
    torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=0.4, msg=lambda m: f"{what}: {m}")


def job_capture_replay(ctx, op, variant, replays, side_stream, config=None):
    fn = registry.get(op, variant)
    if config is not None:
        fn = functools.partial(fn, config=tilefuse.Config(**config))
    a, b = _fresh(ctx, op, seed=1)
    static_a, static_b = a.clone(), b.clone()
    fn(static_a, static_b)  # eager: creates the workspaces
    torch.cuda.synchronize()
    tilefuse.barrier()
    g = torch.cuda.CUDAGraph()
    if side_stream:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
            static_out = fn(static_a, static_b)
        torch.cuda.current_stream().wait_stream(s)
    else:
        with torch.cuda.graph(g):
            static_out = fn(static_a, static_b)
    tilefuse.barrier()
    for i in range(replays):
        a, b = _fresh(ctx, op, seed=100 + i)
        static_a.copy_(a)
        static_b.copy_(b)
        g.replay()
        torch.cuda.synchronize()
        ref = registry.get(op, "reference")(a, b)
        _close(static_out, ref, f"{op}/{variant} replay {i}")
    tilefuse.synchronize()
    tilefuse.barrier()
    # After clear_workspaces() a replay aborts on the device and the next check raises.
    tilefuse.clear_workspaces()
    g.replay()
    with pytest.raises(tilefuse.StaleCallError):
        tilefuse.synchronize()
    assert torch.isnan(static_out).all(), "an aborted replay must not leave a result"
    tilefuse.barrier()
    del g
    return True


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_capture_replay(pools, on_gpu, op, variant):
    if not on_gpu:
        pytest.skip("CUDA graphs need a GPU")
    assert all(pools.run(2, job_capture_replay, op, variant, 100, False))


@pytest.mark.parametrize("op", OPS)
def test_capture_on_side_stream_world1_and_3(pools, on_gpu, op):
    if not on_gpu:
        pytest.skip("CUDA graphs need a GPU")
    assert all(pools.run(1, job_capture_replay, op, "wg_specialized", 10, True))
    assert all(pools.run(3, job_capture_replay, op, "producer_consumer", 10, True))


@pytest.mark.parametrize("world", [2, 3])
def test_capture_replay_copy_engine_form(pools, on_gpu, world):
    """all_gather_gemm's copy_engine form: the copy-engine transfers are captured with the kernels."""
    if not on_gpu:
        pytest.skip("CUDA graphs need a GPU")
    cfg = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=1, num_warps=4, num_stages=3, GEMM_SMS=16, COMM_SMS=0)
    assert all(pools.run(world, job_capture_replay, "all_gather_gemm", "copy_engine", 20, world == 3, cfg))


def job_capture_needs_eager_call(ctx):
    a, b = _fresh(ctx, "gemm_all_scatter", seed=2)
    a = a[:40]  # a shape never called eagerly
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="eager call"):
        with torch.cuda.graph(g):
            tilefuse.gemm_all_scatter(a, b, variant="fused_sequential")
    tilefuse.reset()
    return True


def test_capture_of_a_new_shape_raises(pools, on_gpu):
    if not on_gpu:
        pytest.skip("CUDA graphs need a GPU")
    assert all(pools.run(2, job_capture_needs_eager_call))


def job_two_streams(ctx, calls):
    """Back-to-back calls alternating between two streams, no host sync: all correct."""
    streams = [torch.cuda.current_stream(), torch.cuda.Stream()]
    outs, refs = [], []
    for i in range(calls):
        for op in OPS:
            a, b = _fresh(ctx, op, seed=200 + i)
            refs.append(registry.get(op, "reference")(a, b))
            s = streams[i % 2]
            s.wait_stream(torch.cuda.current_stream()) if i % 2 else None
            with torch.cuda.stream(s):
                outs.append(registry.get(op, VARIANTS[i % 4])(a, b))
    torch.cuda.synchronize()
    for i, (got, ref) in enumerate(zip(outs, refs)):
        _close(got, ref, f"call {i}")
    tilefuse.barrier()
    return True


def test_two_stream_calls(pools, on_gpu):
    if not on_gpu:
        pytest.skip("CUDA graphs need a GPU")
    assert all(pools.run(2, job_two_streams, 8))
