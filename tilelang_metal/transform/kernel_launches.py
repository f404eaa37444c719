"""The thread launch of each kernel in a function: what every per-kernel analysis reads.

Until SplitHostDevice, one PrimFunc holds every `with T.Kernel(...)` block of the module
(docs/calling_convention.md), each a chain of `thread_extent` attributes (blockIdx.*, threadIdx.*)
around its body, one kernel after another. Kernels of one function may have different thread
counts and dimensionality, so an analysis that needs the threadgroup size must read the launch of
the kernel its statement is in, never collect the attributes of the whole function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..host import THREAD_EXTENT_ATTR, tir, tvm
from ..core.ir_attrs import find_nodes
from ..host import vocab

THREAD_TAGS = ("threadIdx.x", "threadIdx.y", "threadIdx.z")


@dataclass(frozen=True)
class ThreadLaunch:
    """The threadIdx attributes of one kernel: tag -> (variable, extent expression)."""

    bindings: dict[str, tuple[Any, Any]]

    def extent(self, tag: str) -> int | None:
        """Static extent of `tag` (1 when the kernel does not bind it; None when symbolic)."""
        if tag not in self.bindings:
            return 1
        value = self.bindings[tag][1]
        return int(value.value) if isinstance(value, tir.IntImm) else None

    @property
    def tx(self) -> Any:
        """The threadIdx.x variable, or None when the kernel binds no x thread."""
        return self.bindings["threadIdx.x"][0] if "threadIdx.x" in self.bindings else None

    @property
    def threads(self) -> int | None:
        """Threads per threadgroup, or None when an extent is symbolic."""
        total = 1
        for tag in THREAD_TAGS:
            n = self.extent(tag)
            if n is None:
                return None
            total *= n
        return total

    @property
    def is_one_dimensional(self) -> bool:
        return self.extent("threadIdx.y") == 1 and self.extent("threadIdx.z") == 1

    def shape_text(self) -> str:
        """`threadIdx.x=32, threadIdx.y=2` for messages (unit y / z left out)."""
        shown = [tag for tag in THREAD_TAGS if tag in self.bindings and (tag == "threadIdx.x" or self.extent(tag) != 1)]
        return ", ".join(f"{tag}={self.bindings[tag][1]}" for tag in shown)


def _is_launch(node: Any) -> bool:
    return isinstance(node, tir.AttrStmt) and str(node.attr_key) == THREAD_EXTENT_ATTR


def launch_of(kernel: Any) -> ThreadLaunch:
    """The thread launch of one kernel (a statement holding a single kernel's attributes)."""
    bindings: dict[str, tuple[Any, Any]] = {}
    for node in find_nodes(kernel, [vocab.TIRX_ATTRSTMT]):
        if _is_launch(node):
            tag = str(node.node.thread_tag)
            if tag in THREAD_TAGS:
                bindings.setdefault(tag, (node.node.var, node.value))
    return ThreadLaunch(bindings)


def rewrite_kernels(body: Any, rewrite: Callable[[Any, ThreadLaunch], Any]) -> Any:
    """`body` with each kernel (its outermost `thread_extent` attribute, chain included) replaced by
    `rewrite(kernel, launch)`; statements outside every kernel are kept."""

    def at_kernel(node: Any) -> Any:
        if not _is_launch(node):
            return None
        return rewrite(node, launch_of(node))  # the kernel's root: no descent below it

    return tvm.tirx.stmt_functor.ir_transform(body, at_kernel, None, [vocab.TIRX_ATTRSTMT])


def kernels(body: Any) -> list[tuple[Any, ThreadLaunch]]:
    """Every kernel of `body` with its thread launch, in program order."""
    found: list[tuple[Any, ThreadLaunch]] = []

    def record(kernel: Any, launch: ThreadLaunch) -> Any:
        found.append((kernel, launch))
        return kernel

    rewrite_kernels(body, record)
    return found
