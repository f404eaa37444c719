"""Per-threadgroup limits of Apple GPUs, defined once: the lowering's refusal, the staging bypass,
the autotuner's search space, flash attention's configuration check and the emulator's launch all
read them from here (no tilelang import, so the emulator can use it on its own)."""

from __future__ import annotations

THREADGROUP_MEMORY_BYTES = 32 * 1024  # threadgroup memory one threadgroup may allocate (32 KiB)
THREADGROUP_MEMORY_TEXT = "32 KiB"
MAX_THREADS_PER_THREADGROUP = 1024

# Entries of the buffer argument table of one kernel function, indices 0..30: Apple's Metal Feature
# Set Tables ("Maximum number of entries in the buffer argument table, per graphics or kernel
# function": 31 on every GPU family; https://developer.apple.com/metal/Metal-Feature-Set-Tables.pdf).
# A `[[ buffer(31) ]]` does not compile on a Mac, so the printer refuses it and the emulator too.
BUFFER_ARGUMENT_SLOTS = 31
