"""Device buffers of a foreign launch between PROT_NONE guard pages: an access past a buffer's end
(or far before its start) faults, and the runtime's fault handler names the buffer from the
`_GuardRegion` table."""

from __future__ import annotations

import ctypes
import mmap

_PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_PROT_NONE = 0


class _GuardRegion(ctypes.Structure):
    _fields_ = [("lo", ctypes.c_void_p), ("hi", ctypes.c_void_p), ("data", ctypes.c_void_p),
                ("bytes", ctypes.c_uint64), ("name", ctypes.c_char_p), ("buffer", ctypes.c_int32),
                ("traced", ctypes.c_int32)]


class _Guarded:
    """`nbytes` of memory whose end touches a PROT_NONE page (a second one lies a page below its
    first page): reads and writes past the end fault. The start is 16-byte aligned, so up to 15 bytes
    past the end of a buffer whose size is not a multiple of 16 are not caught."""

    def __init__(self, nbytes: int) -> None:
        padded = (nbytes + 15) // 16 * 16
        data_pages = max(1, (padded + _PAGE - 1) // _PAGE)
        self.total = (data_pages + 2) * _PAGE
        self.map = mmap.mmap(-1, self.total)
        self._view = ctypes.c_char.from_buffer(self.map)
        self.base = ctypes.addressof(self._view)
        back = self.base + (data_pages + 1) * _PAGE
        self.address = back - padded
        self.nbytes = nbytes
        for page in (self.base, back):
            if _libc.mprotect(page, _PAGE, _PROT_NONE) != 0:
                raise OSError(ctypes.get_errno(), "mprotect of a guard page failed")
        self.guard_lo, self.guard_hi = self.base, self.base + self.total

    def close(self) -> None:
        for page in (self.base, self.base + self.total - _PAGE):
            _libc.mprotect(page, _PAGE, mmap.PROT_READ | mmap.PROT_WRITE)
        del self._view
        self.map.close()
