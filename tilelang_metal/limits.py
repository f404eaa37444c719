"""Per-threadgroup limits of Apple GPUs, defined once: the lowering's refusal, the staging bypass,
the autotuner's search space, flash attention's configuration check and the emulator's launch all
read them from here (no tilelang import, so the emulator can use it on its own)."""

from __future__ import annotations

THREADGROUP_MEMORY_BYTES = 32 * 1024  # threadgroup memory one threadgroup may allocate (32 KiB)
THREADGROUP_MEMORY_TEXT = "32 KiB"
MAX_THREADS_PER_THREADGROUP = 1024
