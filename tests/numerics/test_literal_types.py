"""The printer memoizes expression text per IR object. TVM hashes an IntImm by its value, so an
int32 8 and a uint32 8 share a memo key: without an identity check the second is printed with the
first one's type, and `x < 8` on a negative int32 x became `x < 8u` (false: the comparison is
unsigned)."""

import functools

import tilelang
import tilelang.language as T
import torch


@functools.lru_cache(maxsize=None)
def mixed_literals():
    @T.prim_func
    def main(X: T.Tensor((16,), "int32"), U: T.Tensor((16,), "uint32"), Y: T.Tensor((16,), "int32")):
        with T.Kernel(1, threads=16):
            i = T.get_thread_binding()
            U[i] = T.Cast("uint32", X[i]) + T.uint32(8)
            Y[i] = T.if_then_else(X[i] < 8, 1, 0)

    return tilelang.compile(main, target="metal", execution_backend="emulator")


def test_equal_integer_constants_of_different_types_print_their_own_type():
    x = torch.arange(-8, 8, dtype=torch.int32) * 3
    u = torch.empty(16, dtype=torch.int32)  # uint32 is passed as its bits
    y = torch.empty(16, dtype=torch.int32)
    mixed_literals()(x, u.view(torch.uint32) if hasattr(torch, "uint32") else u, y)
    assert torch.equal(y, (x < 8).int())
    assert torch.equal(u, x + 8)  # modulo 2^32, the same bits
