"""Host time of an op call relaunched as one CUDA graph with its pointers updated, against the eager call.

    python -m benchmarks graph_relaunch [--ops all] [--variants producer_consumer,fused_sequential]
                                        [--M 1,16] [--N 4096] [--K 8192] [--calls 200] [--rounds 7]
                                        [--csv graph_relaunch.csv]

World 1, one GPU. The question it answers: would a launch plan that replays its call as one graph
launch (the call's kernels and its fork and join captured once, each call writing its own tensors'
addresses into the kernel nodes) cost less host time than replaying the launches one by one? Per op,
M and variant, one call is captured into a CUDA graph (``torch.cuda.CUDAGraph(keep_graph=True)``)
after warm-up calls; its kernel nodes are read back through the driver (``cuGraphKernelNodeGetParams``,
``cuFuncGetParamInfo`` for each parameter's offset and size). Methods, interleaved in ``--rounds``
rounds of ``--calls`` back-to-back calls:

- ``plain``: the public function with ``variant="plain"`` (torch.matmul at world 1);
- ``eager``: the public function with the variant (its launch plan replays from the third call);
- ``relaunch``: a fresh output (``torch.empty``), then for each kernel node that holds the address
  of ``a``, ``b`` or the captured output, those parameters rewritten (``a`` and ``b`` with the same
  tensors, the output with the fresh one) and ``cuGraphExecKernelNodeSetParams``, then
  ``cuGraphLaunch`` on the current stream: the host work of such a replay without the collective
  call's bookkeeping (its begin, its error checks), which every form shares;
- ``graph_launch``: ``cuGraphLaunch`` alone (no update, no output): the floor of any graph form;
- ``torch_replay``: ``CUDAGraph.replay()``.

The value is the median over rounds of the mean time per call (``metric=host_us``, wall clock; the
device idle at the start of each method's calls; ``done_us``: until the device finished them) and
``ratio_plain``; ``kernel_nodes``, ``updated_nodes`` and ``nodes`` count the graph's nodes; ``match``
is 1 where the relaunched output equals the eager call's bit for bit (0 otherwise: the numbers of a
relaunch that did not compute the call are not a measurement of one).
"""

from __future__ import annotations

import argparse
import ctypes
import time

import torch

from .host_path import CSV_COLUMNS, interleaved_us


def _watched_node(drv, handle, watched: list):
    """A kernel node (:class:`tilefuse.runtime.relaunch._Node`) whose 8-byte words equal to one of the
    ``watched`` addresses are rewritten: ``(offset, index in watched, 0)``."""
    from tilefuse.runtime import relaunch

    read = relaunch.read_node(drv, handle)
    if read is None:
        raise RuntimeError("a kernel node's parameter layout is unknown")
    p, layout, buf, at, words = read
    hits = [(o, watched.index(w), 0) for o, w in zip(at, words) if w in watched]
    return relaunch._Node(handle, p, layout, buf, hits)


def _capture(fn, a, b):
    """``(graph, static output)``: one call of ``fn`` captured (instantiated, kept)."""
    g = torch.cuda.CUDAGraph(keep_graph=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(a, b)  # warm on the capture's stream too
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        out = fn(a, b)
    g.instantiate()
    return g, out


def _job(ctx, ops, variants, Ms, N, K, calls, rounds) -> list:
    import tilefuse

    if not ctx.on_gpu:
        raise RuntimeError("graph_relaunch needs a GPU")
    from tilefuse.runtime import relaunch

    drv = relaunch.driver()
    rows = []
    dtype = torch.bfloat16
    with torch.no_grad():
        for op in ops:
            public = getattr(tilefuse, op)
            for M in Ms:
                gen = torch.Generator().manual_seed(1)
                a = torch.randn(M, K, generator=gen).to(ctx.device, dtype)
                b = torch.randn(K, N, generator=gen).to(ctx.device, dtype)
                fns = {"plain": lambda a=a, b=b, public=public: public(a, b, variant="plain")}
                counts = {}
                for v in variants:
                    call = (lambda a, b, v=v, public=public: public(a, b, variant=v))
                    for _ in range(3):
                        call(a, b)
                    g, static = _capture(call, a, b)
                    nodes = relaunch._nodes(drv, g.raw_cuda_graph())
                    exec_ = ctypes.c_void_p(g.raw_cuda_graph_exec())
                    watched = [a.data_ptr(), b.data_ptr(), static.data_ptr()]
                    knodes = [_watched_node(drv, h, watched) for h, kind in nodes if kind == relaunch._KERNEL_NODE]
                    upd = [k for k in knodes if k.words]
                    shape, sdtype = tuple(static.shape), static.dtype

                    def relaunched(upd=upd, exec_=exec_, shape=shape, sdtype=sdtype, a=a, b=b):
                        out = torch.empty(shape, dtype=sdtype, device="cuda")
                        err, what = relaunch.write_and_launch(drv, exec_, upd, (a, b, out),
                                                              torch.cuda.current_stream().cuda_stream)
                        relaunch._check(err, what)
                        return out

                    def graph_launch(exec_=exec_):
                        relaunch._check(drv.launch(exec_, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)),
                                        "cuGraphLaunch")

                    want = call(a, b).clone()
                    got = relaunched()
                    torch.cuda.synchronize()
                    counts[v] = {"nodes": len(nodes), "kernel_nodes": len(knodes), "updated_nodes": len(upd),
                                 "match": int(torch.equal(want, got))}
                    fns[f"{v}_eager"] = lambda call=call, a=a, b=b: call(a, b)
                    fns[f"{v}_relaunch"] = relaunched
                    fns[f"{v}_graph_launch"] = graph_launch
                    fns[f"{v}_torch_replay"] = g.replay
                    fns[f"_keep_{v}"] = (g, static)  # the graph and its output live as long as fns
                timed = {k: f for k, f in fns.items() if not k.startswith("_keep_")}
                med, done = interleaved_us(timed, calls, rounds, time.perf_counter, torch.cuda.synchronize)
                for name, us in med.items():
                    base = dict(op=op, variant=name, M=M, N=N, K=K, dtype="bf16", world=ctx.world, note="")
                    rows.append({**base, "metric": "host_us", "value": us})
                    rows.append({**base, "metric": "ratio_plain", "value": us / med["plain"]})
                    rows.append({**base, "metric": "done_us", "value": done[name]})
                for v, c in counts.items():
                    for metric, value in c.items():
                        rows.append(dict(op=op, variant=v, M=M, N=N, K=K, dtype="bf16", world=ctx.world,
                                         metric=metric, value=value, note=""))
                del fns, timed
                tilefuse.synchronize()
            tilefuse.clear_workspaces()
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default="all", help="comma-separated ops, or all")
    p.add_argument("--variants", default="producer_consumer,fused_sequential")
    p.add_argument("--M", default="1,16")
    p.add_argument("--N", type=int, default=4096)
    p.add_argument("--K", type=int, default=8192)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--csv", default="graph_relaunch.csv")
    args = p.parse_args(argv)

    from tilefuse.ops import registry

    from .launch import launch, use_interpreter_without_gpu
    from .results import commit_id, write_rows

    if use_interpreter_without_gpu():
        p.error("graph_relaunch needs a GPU")
    ops = list(registry.OPS) if args.ops == "all" else args.ops.split(",")
    Ms = [int(m) for m in args.M.split(",")]
    [rows] = launch(_job, 1, ops, args.variants.split(","), Ms, args.N, args.K, args.calls, args.rounds)
    device, commit = torch.cuda.get_device_name(), commit_id()
    print(f"graph_relaunch: world 1, N={args.N}, K={args.K}, bf16, {device}, commit {commit}")
    for r in rows:
        print(f"{r['op']:20s} M={r['M']:<5d} {r['variant']:34s} {r['metric']:14s} {r['value']:10.2f}")
    write_rows(args.csv, rows, CSV_COLUMNS, device=device, commit=commit)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
