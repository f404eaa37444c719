"""What the plugin compiles for: the `"metal"` target's normalization and Metal 4 detection
(`normalize.py`), the matrix instructions as data (`isa.py`), the per-threadgroup limits of Apple
GPUs (`limits.py`) and a target's capabilities derived once from its keys (`capabilities.py`).

Imports nothing here, so `limits.py` and `isa.py` stay importable without tilelang (the emulator
reads them)."""
