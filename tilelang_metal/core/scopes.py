"""TileLang storage scopes as the Metal backend groups them (one definition for every module)."""

from __future__ import annotations

GLOBAL_SCOPES = ("global",)
SHARED_SCOPES = ("shared", "shared.dyn")  # threadgroup memory
FRAGMENT_SCOPES = ("local.fragment",)  # register fragments laid out by layout inference
SIMDGROUP_SCOPES = ("metal.simdgroup",)  # whole 8x8 simdgroup matrices (tilelang's Metal scope)
THREAD_SCOPES = ("local", "local.var", "local.fragment", "metal.simdgroup")  # per-thread storage
