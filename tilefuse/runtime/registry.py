"""The groups tilefuse is initialised on in this process: the one module-level registry.

:data:`REGISTRY` maps each process group (and its name) to its :class:`~tilefuse.runtime.group.Group`
and names the default group, the first one initialised, which ``group=None`` means. It also holds
what the calls of every group share: one lock (one call at a time per process) and one stream order
(calls on different streams run one after another in the order the host made them, whatever their
group), so device scratch shared by all groups is never used by two calls at once; and the hooks the
ops register to drop their workspaces at reset and shutdown.
"""

from __future__ import annotations

import threading

import torch.distributed as dist

from . import hostsync
from .errors import describe_group
from .group import Group, StreamOrder


class Registry:
    __slots__ = ("by_group", "by_name", "default", "lock", "order", "reset_hooks", "shutdown_hooks")

    def __init__(self):
        self.by_group: dict = {}  # process group -> Group, in the order the groups were initialised
        self.by_name: dict = {}  # group name -> Group
        self.default: Group | None = None
        self.lock = threading.RLock()
        self.order = StreamOrder()
        self.reset_hooks: list = []
        self.shutdown_hooks: list = []

    def add(self, g: Group) -> None:
        self.by_group[g.group] = self.by_name[g.name] = g
        if self.default is None:
            self.default = g

    def forget(self, g: Group) -> None:
        """Drop ``g`` (its heap is closed by the caller); the default goes last."""
        g.close_peers()
        for reg, key in ((self.by_group, g.group), (self.by_name, g.name)):
            if reg.get(key) is g:
                del reg[key]
        if self.default is g:
            self.default = next(iter(self.by_group.values()), None)

    def find(self, group) -> Group | None:
        """The group state serving ``group`` (a ProcessGroup or its name; None: the default), or
        None where that group was never initialised on this rank."""
        if group is None:
            return self.default
        g = self.by_group.get(group)
        if g is not None:
            return g
        if isinstance(group, str):
            return self.by_name.get(group)
        try:
            name = hostsync._group_name(group)
        except Exception:  # not a process group, or one this rank is not a member of
            return None
        return self.by_name.get(name)  # another Python object for the same group (its name resolved again)

    def get(self, group, what: str = "tilefuse") -> Group:
        """The group state serving ``group`` (None: the default); a clear error where it was never
        initialised on this rank."""
        g = self.by_group.get(group) if group is not None else self.default
        if g is not None:
            return g
        g = self.find(group)
        if g is not None:
            return g
        if self.default is None or group is None:
            raise RuntimeError(f"{what}: tilefuse is not initialised on this rank: call tilefuse.init() first")
        rank = dist.get_rank() if dist.is_initialized() else -1
        known = ", ".join(describe_group(s.group) for s in self.by_group.values())
        raise RuntimeError(
            f"{what}: tilefuse is not initialised for process group {describe_group(group)} on global rank "
            f"{rank}: call tilefuse.init(group=...) with that group on every rank of it first (each process "
            f"group has a heap of its own; initialised here: {known})"
        )


REGISTRY = Registry()
