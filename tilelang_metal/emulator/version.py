"""Version of the shim's semantics; part of every build-cache key."""

# Keep equal to TLM_SHIM_VERSION in shim/tlm/config.h (a test checks it).
SHIM_VERSION = "1.6.0"
