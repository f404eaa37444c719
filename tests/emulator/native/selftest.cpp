// Native smoke test of the emulator runtime + shim, built by CMake (no Python involved):
// a threadgroup-memory reverse with a barrier, a simd_sum, and a divergent barrier that must be
// reported. The kernel is written the way the Python driver generator would bind it.
#include <metal_stdlib>
#include <metal_simdgroup>

#include <cstdio>
#include <cstring>

using namespace metal;

static void reverse_sum(tlm::checked_ptr<const float> A, tlm::checked_ptr<float> B, tlm::checked_ptr<float> S,
                        uint3 blockIdx, uint3 threadIdx, ushort __lane) {
  tlm::checked_ptr<float> A_shared = tlm::threadgroup_array<float>(0, 128, "A_shared");
  A_shared[((int)threadIdx.x)] = A[((((int)blockIdx.x) * 128) + ((int)threadIdx.x))];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  B[((((int)blockIdx.x) * 128) + ((int)threadIdx.x))] = A_shared[(127 - ((int)threadIdx.x))];
  float s = simd_sum(A_shared[((int)threadIdx.x)]);
  if (__lane == 0) S[((((int)blockIdx.x) * 4) + (((int)threadIdx.x) / 32))] = s;
}

static void entry(const tlm::rt::lane_info& li, void* const* buf, const int64_t* n) {
  reverse_sum(tlm::device_buffer<const float>(buf[0], n[0], "A"), tlm::device_buffer<float>(buf[1], n[1], "B"),
              tlm::device_buffer<float>(buf[2], n[2], "S"), uint3(li.tg[0], li.tg[1], li.tg[2]),
              uint3(li.tid[0], li.tid[1], li.tid[2]), (ushort)li.lane);
}

static void divergent(const tlm::rt::lane_info& li, void* const*, const int64_t*) {
  if (li.linear < 96) threadgroup_barrier(mem_flags::mem_threadgroup);
}

static int run(tlm::rt::entry_fn fn, void* const* bufs, const int64_t* counts, char* err) {
  tlm::rt::launch_params p{};
  p.entry = fn;
  p.buffers = bufs;
  p.counts = counts;
  p.grid[0] = 4, p.grid[1] = 1, p.grid[2] = 1;
  p.block[0] = 128, p.block[1] = 1, p.block[2] = 1;
  p.workers = 2;
  p.stack_bytes = 64 * 1024;
  p.threadgroup_limit = 32 * 1024;
  p.error = err;
  p.error_len = 512;
  return tlm::rt::launch(p);
}

int main() {
  static float a[512], b[512], s[16];
  for (int i = 0; i < 512; ++i) a[i] = static_cast<float>(i % 7) - 3.0f;
  void* bufs[3] = {a, b, s};
  int64_t counts[3] = {512, 512, 16};
  char err[512] = {0};
  if (run(entry, bufs, counts, err) != 0) {
    std::printf("FAIL: unexpected error: %s\n", err);
    return 1;
  }
  for (int g = 0; g < 4; ++g)
    for (int t = 0; t < 128; ++t)
      if (b[g * 128 + t] != a[g * 128 + 127 - t]) {
        std::printf("FAIL: reverse mismatch at %d\n", g * 128 + t);
        return 1;
      }
  for (int r = 0; r < 16; ++r) {
    float ref = 0.0f;
    for (int l = 0; l < 32; ++l) ref += a[r * 32 + l];
    if (s[r] != ref) {
      std::printf("FAIL: simd_sum %d: %f != %f\n", r, s[r], ref);
      return 1;
    }
  }
  if (run(divergent, bufs, counts, err) == 0 || !std::strstr(err, "96 of 128 threads")) {
    std::printf("FAIL: divergent barrier not reported (%s)\n", err);
    return 1;
  }
  std::printf("ok (%s)\n", err);
  return 0;
}
