// Per-lane element layouts of Apple's cooperative matrix types, written down once.
// Provenance and derivations: docs/lane_layouts.md. These are implemented here from that
// provenance and never generated from the emitter's tables, so that a wrong lane mapping in the
// emitter makes numeric tests fail.
#pragma once

namespace tlm::layout {

// simdgroup_matrix<T, 8, 8>::thread_elements(): lane l holds elements (row, col) and (row, col + 1)
// (MLX steel mma.h: qid = l / 4; row = (qid & 4) + (l / 2) % 4; col = (qid & 2) * 2 + (l % 2) * 2).
constexpr int sg8_row(int lane) { return ((lane / 4) & 4) + (lane / 2) % 4; }
constexpr int sg8_col(int lane) { return ((lane / 4) & 2) * 2 + (lane % 2) * 2; }

// The lane layout of simdgroup_matrix<T, Rows, Cols> (simdgroup_matrix.h is a template on the shape;
// 8x8 is the only shape MSL has): `elems` adjacent elements per lane from (row(lane), col(lane)).
template <int Rows, int Cols> struct simdgroup_layout;
template <> struct simdgroup_layout<8, 8> {
  static constexpr int elems = 2;
  static constexpr int row(int lane) { return sg8_row(lane); }
  static constexpr int col(int lane) { return sg8_col(lane); }
};

// MPP cooperative tensors of matmul2d(16, 32, 16): left 16x16 (8 elements per lane), right and
// destination 16x32 (16 elements per lane); lane l, element e:
//   row = ((l >> 2) & 4) + ((l >> 1) & 3) + 8 * ((e >> 2) & 1)
//   col = 16 * (e >> 3) + 4 * (((l >> 2) & 2) + (l & 1)) + (e & 3)
// (de-facto layout of MLX NAX kernels and TileLang's in-tree emitter; Apple: implementation-defined).
constexpr int ct_row(int lane, int e) { return ((lane >> 2) & 4) + ((lane >> 1) & 3) + 8 * ((e >> 2) & 1); }
constexpr int ct_col(int lane, int e) { return 16 * (e >> 3) + 4 * (((lane >> 2) & 2) + (lane & 1)) + (e & 3); }

// Both layouts must be bijections between (lane, element) and matrix positions.
constexpr bool sg8_is_bijection() {
  bool seen[64] = {};
  for (int l = 0; l < 32; ++l)
    for (int j = 0; j < 2; ++j) {
      int idx = sg8_row(l) * 8 + sg8_col(l) + j;
      if (idx < 0 || idx >= 64 || seen[idx]) return false;
      seen[idx] = true;
    }
  return true;
}
constexpr bool ct_is_bijection(int rows, int cols, int elems) {
  bool seen[16 * 32] = {};
  for (int l = 0; l < 32; ++l)
    for (int e = 0; e < elems; ++e) {
      int r = ct_row(l, e), c = ct_col(l, e);
      if (r < 0 || r >= rows || c < 0 || c >= cols || seen[r * cols + c]) return false;
      seen[r * cols + c] = true;
    }
  return true;
}
// The matmul kernels below rely on elements 4b..4b+3 being four consecutive columns of one row.
constexpr bool ct_quads_contiguous() {
  for (int l = 0; l < 32; ++l)
    for (int e = 0; e < 16; ++e)
      if (ct_row(l, e) != ct_row(l, e & ~3) || ct_col(l, e) != ct_col(l, e & ~3) + (e & 3)) return false;
  return true;
}
static_assert(sg8_is_bijection());
static_assert(ct_is_bijection(16, 16, 8));
static_assert(ct_is_bijection(16, 32, 16));
static_assert(ct_quads_contiguous());

}  // namespace tlm::layout
