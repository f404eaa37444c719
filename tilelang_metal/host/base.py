"""The host's objects the plugin uses, imported once after the version guard: TVM (bundled with
tilelang), its FFI, TIR, Target, and tilelang's backend types (re-exported so no module outside
`host/` imports tilelang or TVM internals)."""

from __future__ import annotations

from .guard import check_host_version

check_host_version()

import tvm_ffi  # noqa: E402  (after the version guard on purpose)
from tilelang import tvm  # noqa: E402

# host types the rest of the plugin may use
from tilelang.backend.device_codegen import DeviceCodegen  # noqa: E402,F401
from tilelang.backend.execution_backend import ExecutionBackendSpec  # noqa: E402,F401
from tilelang.backend.host_codegen import STANDARD_HOST_CODEGENS, HostCodegenHook  # noqa: E402,F401
from tilelang.backend.module import BackendModule  # noqa: E402
from tilelang.backend.pass_pipeline import PassPipeline  # noqa: E402,F401

Target = tvm.target.Target
tir = tvm.tirx
