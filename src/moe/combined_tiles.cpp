#include "moe/combined_tiles.h"

#include <vector>

#include "core/unit_gemm.h"
#include "moe/activation_rows.h"

namespace mf {
namespace {

// base + index[i] * stride (index: none for 0, 1, 2, ...)
template <typename T>
std::vector<T*> row_pointers(T* base, const int64_t* index, int64_t n, int64_t stride) {
  std::vector<T*> rows(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) rows[i] = base + (index ? index[i] : i) * stride;
  return rows;
}

// the rows of gate_up[e] (or of its gradient) that unit u uses, in H's column order
template <typename T>
std::vector<T*> w1_rows(const UnitSlices& units, size_t u, T* expert_rows, int64_t D) {
  std::vector<T*> rows;
  for (auto [first, count] : units.w1_rows(units.block(u)))
    for (int64_t i = 0; i < count; ++i) rows.push_back(expert_rows + (first + i) * D);
  return rows;
}

// W2's block columns of down[e] [D, F]: row d of the block starts at d F + b M
template <typename T>
std::vector<T*> w2_rows(const UnitSlices& units, size_t u, T* down_e, int64_t D) {
  return row_pointers(down_e + units.block(u) * units.M, nullptr, D, units.F);
}

}  // namespace

void tiles_forward(const TileChunk& c, float* h, float* a, float* y) {
  const auto& units = c.units;
  const int64_t hidden = units.hidden(), M = units.M;
  const auto x_rows = row_pointers(c.x, c.token, c.n, c.D);
  const auto w1 = w1_rows(units, c.u, c.gate_up, c.D);
  const auto h_rows = row_pointers(h, nullptr, c.n, hidden);
  // H = X W1^T + b1: B = W1^T, read by its columns (W1's rows); b1's entries in H's column order
  std::vector<float> b1;
  if (c.b1)
    for (auto [first, count] : units.w1_rows(units.block(c.u))) b1.insert(b1.end(), c.b1 + first, c.b1 + first + count);
  unit_gemm({c.n, hidden, c.D, x_rows.data(), false, w1.data(), true, h_rows.data(), nullptr, false,
             c.b1 ? b1.data() : nullptr},
            c.workspace);
  activation_forward_rows(h, a, c.n, M, units.swiglu);
  // y[token] += w (A W2^T + b2): B = W2^T, read by its columns (W2's rows)
  const auto a_rows = row_pointers<const float>(a, nullptr, c.n, M);
  const auto w2 = w2_rows(units, c.u, c.down, c.D);
  const auto y_rows = row_pointers(y, c.token, c.n, c.D);
  unit_gemm({c.n, c.D, M, a_rows.data(), false, w2.data(), true, y_rows.data(), c.weight, true, c.b2}, c.workspace);
}

namespace {

// the output bias's part: dweight_p += dy[token_p] . b2,  db2 += sum_p w_p dy[token_p]
void output_bias_backward(const TileChunk& c, const std::vector<const float*>& dy_rows, const float* b2, float* dweight,
                          float* db2) {
  for (int64_t p = 0; p < c.n; ++p) {
    const float* dy = dy_rows[p];
    float dot = 0;
    for (int64_t i = 0; i < c.D; ++i) {
      dot += dy[i] * b2[i];
      db2[i] += c.weight[p] * dy[i];
    }
    dweight[p] += dot;
  }
}

}  // namespace

void tiles_backward(const TileChunk& c, const float* h, const float* dy, const TileGrads& d, float* g, float* wa,
                    float* dh) {
  const auto& units = c.units;
  const int64_t e = units.expert(c.u), hidden = units.hidden(), M = units.M, n = c.n;
  const auto dy_rows = row_pointers(dy, c.token, n, c.D);
  // G = dy[token] W2
  const auto g_rows = row_pointers(g, nullptr, n, M);
  const auto w2 = w2_rows(units, c.u, c.down, c.D);
  unit_gemm({n, M, c.D, dy_rows.data(), false, w2.data(), false, g_rows.data()}, c.workspace);
  activation_backward_rows(h, g, c.weight, d.dweight, wa, dh, n, M, units.swiglu);
  if (d.db2.defined()) output_bias_backward(c, dy_rows, c.b2, d.dweight, d.db2[e].data_ptr<float>());
  if (d.db1.defined()) units.add_w1(d.db1[e], units.block(c.u), at::from_blob(dh, {n, hidden}, d.db1.options()).sum(0));
  // dW2 (+)= dy[token]^T (w A): A^T's rows are dy's, read by depth
  const auto wa_rows = row_pointers<const float>(wa, nullptr, n, M);
  const auto dw2_rows = w2_rows(units, c.u, d.dw2, c.D);
  unit_gemm({c.D, M, n, dy_rows.data(), true, wa_rows.data(), false, dw2_rows.data(), nullptr, !d.first}, c.workspace);
  // dW1 (+)= dH^T x[token]
  const auto dh_rows = row_pointers<const float>(dh, nullptr, n, hidden);
  const auto x_rows = row_pointers(c.x, c.token, n, c.D);
  const auto dw1_rows = w1_rows(units, c.u, d.dw1, c.D);
  unit_gemm({hidden, c.D, n, dh_rows.data(), true, x_rows.data(), false, dw1_rows.data(), nullptr, !d.first},
            c.workspace);
  // dx[token] += dH W1
  const auto w1 = w1_rows(units, c.u, c.gate_up, c.D);
  const auto dx_rows = row_pointers(d.dx, c.token, n, c.D);
  unit_gemm({n, c.D, hidden, dh_rows.data(), false, w1.data(), false, dx_rows.data(), nullptr, true}, c.workspace);
}

}  // namespace mf
