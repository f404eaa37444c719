"""The vocabulary the passes, the printer and the emulator share: the dtype table (`dtypes.py`), the
storage-scope groups (`scopes.py`), the plugin's intrinsics (`intrinsics.py`) and its records on the
IR (`ir_attrs.py`).

Imports nothing here, so `dtypes.py` stays importable without tilelang (the emulator reads it)."""
