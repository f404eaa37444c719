"""metal4 key normalization: only macOS >= 26 + SDK >= 26 + Apple M5 or newer gets metal4."""

import pytest
from tilelang import tvm

import tilelang_metal  # noqa: F401
from tilelang_metal.target.capabilities import capabilities_of
from tilelang_metal.target.normalize import HostFacts, metal4_supported, metal_target_keys, normalize_metal_target

M5_HOST = HostFacts("26.5.1", "arm64", "26.4", "Apple M5")


@pytest.mark.parametrize(
    "facts,expected",
    [
        (M5_HOST, True),
        (HostFacts("26.0", "arm64", "26.0", "Apple M6 Pro"), True),
        (HostFacts("25.6", "arm64", "26.4", "Apple M5"), False),  # OS too old
        (HostFacts("26.1", "arm64", "15.5", "Apple M5"), False),  # SDK too old
        (HostFacts("26.1", "arm64", None, "Apple M5"), False),  # no xcrun
        (HostFacts("26.1", "arm64", "26.1", "Apple M4 Max"), False),  # GPU too old
        (HostFacts("26.1", "x86_64", "26.1", "Apple M5"), False),  # not arm64
        (HostFacts("", "x86_64", None, None), False),  # Linux
    ],
)
def test_metal4_support_needs_all_three(facts, expected):
    assert metal4_supported(facts) is expected
    assert ("metal4" in metal_target_keys(facts)) is expected


def test_plain_metal_string_on_linux_has_no_metal4():
    linux = HostFacts("", "x86_64", None, None)
    target = normalize_metal_target("metal", linux)
    assert target.kind.name == "metal" and not capabilities_of(target).metal4
    assert capabilities_of(normalize_metal_target("metal", M5_HOST)).metal4


def test_explicit_keys_are_honoured_untouched():
    explicit = {"kind": "metal", "keys": ["metal", "gpu", "metal4"]}
    target = normalize_metal_target(explicit, HostFacts("", "x86_64", None, None))
    assert capabilities_of(target).metal4
    obj = tvm.target.Target({"kind": "metal", "keys": ["metal", "gpu"]})
    assert normalize_metal_target(obj, M5_HOST) is obj
    assert normalize_metal_target("cuda") is None


def test_tilelang_resolves_metal_through_the_plugin():
    from tilelang.backend.target import determine_target

    target = determine_target("metal", return_object=True)
    assert target.kind.name == "metal"
    assert not capabilities_of(target).metal4  # this CI host is Linux
    explicit = determine_target({"kind": "metal", "keys": ["metal", "gpu", "metal4"]}, return_object=True)
    assert capabilities_of(explicit).metal4


def test_apple_gpu_generation_reads_the_brand_string():
    from tilelang_metal.target.normalize import apple_gpu_generation

    assert apple_gpu_generation("Apple M5 Pro") == 5 and apple_gpu_generation("Apple M10 Max") == 10
    assert apple_gpu_generation("Apple M1") == 1
    for brand in (None, "", "Intel(R) Core(TM) i9", "Apple M", "Apple Mx", "AppleM5"):
        assert apple_gpu_generation(brand) == 0, brand


def test_plugin_targets_say_32_lane_simdgroups_and_1024_threads():
    """TVM's metal kind defaults to thread_warp_size 16 and 256 threads; Apple GPUs (and the MSL the
    plugin prints) have 32-lane simdgroups and up to 1024 threads per threadgroup."""
    from tilelang_metal.target.normalize import metal4_target, plain_metal_target

    linux = HostFacts("", "x86_64", None, None)
    for target in (metal4_target(), plain_metal_target(), normalize_metal_target("metal", linux),
                   normalize_metal_target({"kind": "metal", "keys": ["metal", "gpu"]}, linux)):
        attrs = {k: int(target.attrs[k]) for k in ("thread_warp_size", "max_num_threads", "max_threads_per_block")}
        assert attrs == {"thread_warp_size": 32, "max_num_threads": 1024, "max_threads_per_block": 1024}, target
    given = normalize_metal_target({"kind": "metal", "keys": ["metal", "gpu"], "max_num_threads": 512}, linux)
    assert int(given.attrs["max_num_threads"]) == 512  # what the user wrote stays


def test_msl_does_not_depend_on_the_warp_size_attribute():
    import tilelang

    from tilelang_metal import kernels

    tvm_defaults = tvm.target.Target({"kind": "metal", "keys": ["metal", "gpu"]})  # a Target object is kept as given
    assert int(tvm_defaults.attrs["thread_warp_size"]) == 16
    func = kernels.softmax(8, 128)
    assert tilelang.lower(func, target=tvm_defaults).kernel_source == tilelang.lower(func, target="metal").kernel_source
