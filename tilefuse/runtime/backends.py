"""The two ways a rank maps every peer's heap at ``init``; a problem on one rank raises on every rank.

- ``cpu``: each rank creates ``/dev/shm/tilefuse-<token of rank 0>-r<rank>`` (exclusive, no links, mode
  0600), every rank maps every file, then unlinks its own (after a failure, its peers' too).
- ``cuda``: one device allocation, shared through one CUDA IPC handle per peer; each peer's mapping
  is opened on this rank's device and touched once.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
import uuid

import torch

from . import hostsync

SHM_DIR = "/dev/shm"

def agree(group, problem: str | None, step: str, what: str) -> None:
    """Bounded exchange of each rank's problem with a rendezvous step; raise on every rank if any."""
    problems = hostsync.all_gather_object(problem, group, what=step)
    bad = {r: p for r, p in enumerate(problems) if p is not None}
    if bad:
        listing = "; ".join(f"rank {r}: {p}" for r, p in sorted(bad.items()))
        raise RuntimeError(f"{what} failed at '{step}': {listing}")


def map_cpu(group, rank: int, world: int, size: int) -> list:
    """Every rank's heap file mapped here (the files are unlinked on return: the mappings stay)."""
    what = f"tilefuse.init: heap rendezvous of rank {rank}"
    token = hostsync.all_gather_object(uuid.uuid4().hex[:16] if rank == 0 else None, group,
                                       what="tilefuse.init: heap file names")[0]
    paths = [os.path.join(SHM_DIR, f"tilefuse-{token}-r{r}") for r in range(world)]
    own = paths[rank]
    done = False
    try:
        problem = None
        try:
            fd = os.open(own, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.ftruncate(fd, size)
            finally:
                os.close(fd)
        except OSError as err:
            problem = f"cannot create {own}: {err}"
        agree(group, problem, "tilefuse.init: creating the heap files", what)
        tensors: list = []
        problem = None
        for r, path in enumerate(paths):
            try:
                tensors.append(_map_file(path, size))
            except OSError as err:
                problem, tensors = f"cannot map rank {r}'s heap file {path}: {err}", []
                break
        agree(group, problem, "tilefuse.init: mapping the heap files", what)
        done = True
        return tensors
    finally:
        # The mappings outlive the names; after a failure, the files of peers that died go too.
        for path in paths if not done else [own]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def map_cuda(group, rank: int, world: int, size: int, device: torch.device) -> list:
    """Every rank's heap as mapped on ``device`` (this rank's own allocation at index ``rank``)."""
    from torch.multiprocessing.reductions import reduce_tensor

    what = f"tilefuse.init: heap rendezvous of rank {rank} ({device})"
    own = torch.empty(size, dtype=torch.uint8, device=device)
    # One handle per peer: each share carries its own reference count, which that peer releases
    # when it drops its mapping, so the count is exact for any world size.
    handles = [None if r == rank else reduce_tensor(own) for r in range(world)]
    everyone = hostsync.all_gather_object(handles, group, what="tilefuse.init: CUDA IPC handles")
    tensors: list = []
    problem = None
    for r, theirs in enumerate(everyone):
        if r == rank:
            tensors.append(own)
            continue
        try:
            rebuild, args = theirs[rank]
            t = rebuild(*_open_on_device(rebuild, args, device))
            # A mapping this device cannot reach fails here, naming the peer, not inside an op.
            t[:8].sum().item()
        except RuntimeError as err:
            problem, tensors = f"cannot map or read rank {r}'s heap through CUDA IPC: {err}", [own]
            break
        tensors.append(t)
    torch.cuda.synchronize(device)
    agree(group, problem, "tilefuse.init: mapping the peers' heaps", what)
    return tensors


def _open_on_device(rebuild, args: tuple, device: torch.device) -> tuple:
    """``args`` of torch's CUDA IPC rebuild opening the peer's memory on *this* rank's device (not the owner's)."""
    import inspect

    names = list(inspect.signature(rebuild).parameters)
    if "storage_device" not in names:  # pragma: no cover - a torch whose IPC rebuild changed shape
        raise RuntimeError(f"unsupported torch CUDA IPC rebuild signature {names}; tilefuse needs 'storage_device'")
    args = list(args)
    args[names.index("storage_device")] = device.index if device.index is not None else torch.cuda.current_device()
    return tuple(args)


def _map_file(path: str, size: int) -> torch.Tensor:
    """The heap file ``path`` mapped shared as a uint8 tensor, once its descriptor (no links followed)
    shows a private regular file of this user, of the heap's size."""
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise PermissionError(f"{path} is not a private regular file of this user "
                                  f"(mode {stat.filemode(st.st_mode)}, owner uid {st.st_uid})")
        if st.st_size != size:
            raise OSError(f"{path} holds {st.st_size} bytes, expected {size}")
        mem = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    return torch.frombuffer(mem, dtype=torch.uint8)
