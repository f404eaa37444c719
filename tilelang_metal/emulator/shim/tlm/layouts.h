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

// The same pattern for any cooperative tensor whose stored matrix is `rows` x `cols` (multiples of
// 16): element e is element e & 7 of 16x16 block e >> 3, blocks in row-major order over the stored
// matrix, and inside a block the 16x16 formula above (MLX BaseNAXFrag::get_coord). For a transposed
// operand the stored matrix is the transposed one (N x K for the right input): MLX fills ct_b[8..15]
// of a transposed 16x32x16 right input with the fragment of rows (N) 16..31. docs/lane_layouts.md.
constexpr int ct_block_row(int lane, int e, int cols) { return 16 * ((e >> 3) / (cols / 16)) + ct_row(lane, e & 7); }
constexpr int ct_block_col(int lane, int e, int cols) { return 16 * ((e >> 3) % (cols / 16)) + ct_col(lane, e & 7); }

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
// The block form is the 16x32 formula for 16 x 32 and a bijection for the stored shapes in use.
constexpr bool ct_block_matches_16x32() {
  for (int l = 0; l < 32; ++l)
    for (int e = 0; e < 16; ++e)
      if (ct_block_row(l, e, 32) != ct_row(l, e) || ct_block_col(l, e, 32) != ct_col(l, e)) return false;
  return true;
}
constexpr bool ct_block_is_bijection(int rows, int cols) {
  bool seen[32 * 32] = {};
  for (int l = 0; l < 32; ++l)
    for (int e = 0; e < rows * cols / 32; ++e) {
      int r = ct_block_row(l, e, cols), c = ct_block_col(l, e, cols);
      if (r < 0 || r >= rows || c < 0 || c >= cols || seen[r * cols + c]) return false;
      seen[r * cols + c] = true;
    }
  return true;
}
static_assert(ct_block_matches_16x32());
static_assert(ct_block_is_bijection(16, 16) && ct_block_is_bijection(16, 32) && ct_block_is_bijection(32, 16));
static_assert(sg8_is_bijection());
static_assert(ct_is_bijection(16, 16, 8));
static_assert(ct_is_bijection(16, 32, 16));
static_assert(ct_quads_contiguous());

}  // namespace tlm::layout
