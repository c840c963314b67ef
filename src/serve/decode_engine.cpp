#include "serve/decode_engine.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <typeinfo>

#include "core/bf16.h"
#include "core/row_kernel.h"
#include "serve/decode_layers.h"

namespace mf {

using namespace decoding;

// rows of one slot whose attention scores are one product (DecodeEngine::Impl::attend)
constexpr int64_t kAttendRows = 8;

struct DecodeEngine::Impl {
  int64_t D, Hq, Hkv, Dh, V, max_len, slots, rows;  // rows: the most a step takes
  double eps;
  std::vector<Layer> layers;
  const float* final_norm;
  Matrix head;
  at::Tensor embed, cos, sin;
  std::vector<std::vector<std::vector<float>>> keys, values;  // [slot][layer]: [length, Hkv * Dh]
  std::vector<int64_t> length;
  std::vector<int64_t> pos, last;  // the step's rows' positions; the rows whose logits it returns
  // buffers for M <= rows rows, and for their P <= M * K routed pairs grouped by unit: g and u
  // [P, F] (the dense FFN's [M, F] too), part [P, D]; the shared expert's own, its gate per row
  std::vector<float> x, h, h_last, q, k, v, att, y, logits, g, u, part, shared_g, shared_u, shared_part, shared_gate;
  std::vector<std::vector<std::pair<int64_t, float>>> picks;  // row m's routed (unit, weight)
  std::vector<Routed> routed;                                 // per thread
  std::vector<std::pair<int64_t, int64_t>> runs;              // attend's: [m0, m1) of one slot, at most kAttendRows
  SpinBarrier barrier;

  void run(const Team& team, const std::vector<int64_t>& at_slot, int64_t M, float* out);
  void attention(const Team& team, const Layer& l, size_t layer, const std::vector<int64_t>& at_slot, int64_t M);
  void attend(const Team& team, size_t layer, const std::vector<int64_t>& at_slot);
  void feed_forward(const Team& team, const Layer& l, int64_t M);
  void route(const Team& team, const Layer& l, int64_t M);
  void combine(const Team& team, const Layer& l, int64_t M);
  void rope(float* x, int64_t heads, int64_t pos) const;
};

std::string DecodeEngine::unsupported(TransformerLMImpl& model) {
  for (const auto& p : model.parameters())
    if (!decoding::held_weight(p.scalar_type()) || !p.is_cpu())
      return fmt::format("weights in {} on {} (it computes in float32 on the CPU)", c10::toString(p.scalar_type()),
                         p.device().str());
    else if (!p.is_contiguous())
      return "a weight stored with strides (" + fmt::format("{}", fmt::join(p.sizes(), " x ")) + ")";
  const auto& c = model.config();
  if (c.head_width() % 2 || c.n_heads % c.n_kv_heads) return "this attention shape";
  for (size_t i = 0; i < model.model->blocks.size(); ++i) {
    auto& f = *model.model->blocks[i]->mlp;
    std::string why;
    if (auto* moe = dynamic_cast<MoEFeedForward*>(&f); moe && typeid(f) == typeid(MoEFeedForward))
      why = moe_unsupported(*moe);
    else if (typeid(f) != typeid(SwiGLU) && typeid(f) != typeid(GeluMLP))
      why = "the FFN kind \"" + c.ffn + "\"";
    if (!why.empty()) return fmt::format("block {}: {}", i, why);
  }
  return "";
}

DecodeEngine::DecodeEngine(TransformerLMImpl& model, int64_t slots) : impl_(std::make_unique<Impl>()) {
  const auto why = unsupported(model);
  TORCH_CHECK(why.empty(), "the decode engine does not run ", why);
  const auto& c = model.config();
  auto& s = *impl_;
  s.D = c.d_model, s.Hq = c.n_heads, s.Hkv = c.n_kv_heads, s.Dh = c.head_width(), s.V = c.vocab_size;
  s.max_len = c.max_seq_len, s.slots = slots, s.eps = c.norm_eps;
  int64_t widest = 1, experts = 1, top_k = 1, shared = 1;
  for (auto& block : model.model->blocks) {
    auto& f = *block->mlp;
    Layer l = typeid(f) == typeid(MoEFeedForward) ? moe_layer(static_cast<MoEFeedForward&>(f)) : dense_layer(f);
    const auto& a = *block->self_attn;
    l.norm_in = floats(block->input_layernorm->weight);
    l.norm_post = floats(block->post_attention_layernorm->weight);
    l.q = matrix(a.q_proj->weight, a.q_proj->bias), l.k = matrix(a.k_proj->weight, a.k_proj->bias);
    l.v = matrix(a.v_proj->weight, a.v_proj->bias), l.o = matrix(a.o_proj->weight, a.o_proj->bias);
    if (a.q_norm) l.q_norm = floats(a.q_norm->weight), l.k_norm = floats(a.k_norm->weight);
    l.norm_per_head = a.norm_per_head;
    for (auto& u : l.units) widest = std::max(widest, u.gate.N);
    if (l.shared) shared = std::max(shared, l.shared->gate.N);
    if (l.moe) top_k = std::max(top_k, l.router.top_k);
    experts = std::max<int64_t>(experts, static_cast<int64_t>(l.units.size()));
    s.layers.push_back(std::move(l));
  }
  s.final_norm = floats(model.model->norm->weight);
  s.head = matrix(model.head_weight());
  s.embed = model.model->embed_tokens->weight;
  s.cos = model.rope().cos.contiguous(), s.sin = model.rope().sin.contiguous();
  s.keys.assign(slots, std::vector<std::vector<float>>(s.layers.size()));
  s.values = s.keys;
  s.length.assign(slots, 0);
  s.rows = slots + kPrefillRows;
  const int64_t M = s.rows, kv = s.Hkv * s.Dh, P = M * std::max<int64_t>(1, top_k);
  for (auto* b : {&s.x, &s.h, &s.h_last, &s.y}) b->resize(M * s.D);
  s.part.resize(P * s.D);
  s.q.resize(M * s.Hq * s.Dh), s.att.resize(M * s.Hq * s.Dh), s.k.resize(M * kv), s.v.resize(M * kv);
  s.g.resize(P * widest), s.u.resize(P * widest), s.logits.resize(M * experts);
  s.shared_g.resize(M * shared), s.shared_u.resize(M * shared), s.shared_part.resize(M * s.D);
  s.shared_gate.resize(M), s.picks.resize(M);
}

DecodeEngine::~DecodeEngine() = default;

at::Tensor DecodeEngine::prefill(int64_t slot, const std::vector<int64_t>& tokens) {
  TORCH_CHECK(!tokens.empty(), "decode engine: an empty prompt");
  at::Tensor logits;
  for (size_t at = 0; at < tokens.size(); at += kPrefillRows) {
    const auto n = std::min(tokens.size() - at, static_cast<size_t>(kPrefillRows));
    logits = step(std::vector<int64_t>(n, slot), {tokens.begin() + at, tokens.begin() + at + n});
  }
  return logits[0];
}
int64_t DecodeEngine::slots() const { return impl_->slots; }
int64_t DecodeEngine::length(int64_t slot) const { return impl_->length.at(slot); }

void DecodeEngine::clear(int64_t slot) {
  auto& s = *impl_;
  for (auto* cache : {&s.keys.at(slot), &s.values.at(slot)})
    for (auto& layer : *cache) layer.clear();
  s.length[slot] = 0;
}

void DecodeEngine::load(int64_t slot, const std::vector<LayerCache>& caches, int64_t row) {
  auto& s = *impl_;
  TORCH_CHECK(caches.size() == s.layers.size(), "decode engine: ", caches.size(), " layer caches for ", s.layers.size(),
              " layers");
  clear(slot);
  for (size_t l = 0; l < caches.size(); ++l) {
    auto take = [&](const at::Tensor& t_BHLDh, std::vector<float>& into) {  // -> [L, Hkv * Dh]
      const auto t = t_BHLDh.select(0, row).transpose(0, 1).to(at::kFloat).contiguous();
      into.assign(t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
    };
    take(caches[l].k, s.keys[slot][l]);
    take(caches[l].v, s.values[slot][l]);
  }
  s.length[slot] = caches.empty() ? 0 : caches[0].length();
}

// Hugging Face's rotate_half at position pos (RopeTable::apply): pairs (i, i + Dh/2) of each head
void DecodeEngine::Impl::rope(float* x, int64_t heads, int64_t pos) const {
  const double *c = cos.data_ptr<double>() + pos * Dh, *s = sin.data_ptr<double>() + pos * Dh;
  const int64_t half = Dh / 2;
  for (int64_t hd = 0; hd < heads; ++hd, x += Dh)
    for (int64_t i = 0; i < half; ++i) {
      const float a = x[i], b = x[i + half];
      x[i] = a * static_cast<float>(c[i]) - b * static_cast<float>(s[i]);
      x[i + half] = b * static_cast<float>(c[i + half]) + a * static_cast<float>(s[i + half]);
    }
}

// x += o(attention(rope(q), rope(k), v)) of rmsnorm(x); each row's keys and values written to its
// slot's cache. The threads meet only where one reads what another wrote: each norms its share of
// the rows; each owns the kv heads team.share(Hkv) gives it (their q heads, keys and values), whose
// columns it computes, norms, rotates and caches, and attends with them when every thread owns as
// many; each then adds its columns of o's output to x. (One thread norming and rotating every row,
// reading the other's columns across the cores, kept that thread waiting 5-10 us a layer.)
void DecodeEngine::Impl::attention(const Team& team, const Layer& l, size_t layer, const std::vector<int64_t>& at_slot,
                                   int64_t M) {
  const int64_t qw = Hq * Dh, kv = Hkv * Dh, group = Hq / Hkv;
  team.sync();
  for (auto [m, m1] = team.share(M); m < m1; ++m) rms_norm(&x[m * D], D, l.norm_in, eps, &h[m * D]);
  team.sync();
  const auto [g0, g1] = team.share(Hkv);
  times(l.q, h.data(), M, q.data(), g0 * group * Dh, g1 * group * Dh);
  times(l.k, h.data(), M, k.data(), g0 * Dh, g1 * Dh);
  times(l.v, h.data(), M, v.data(), g0 * Dh, g1 * Dh);
  if (l.q_norm && !l.norm_per_head) {  // over the whole projection: every head's columns
    team.sync();
    for (auto [m, m1] = team.share(M); m < m1; ++m)
      rms_norm(&q[m * qw], qw, l.q_norm, eps, &q[m * qw]), rms_norm(&k[m * kv], kv, l.k_norm, eps, &k[m * kv]);
    team.sync();
  }
  for (int64_t m = 0; m < M; ++m) {
    float *qm = &q[m * qw + g0 * group * Dh], *km = &k[m * kv + g0 * Dh];
    if (l.q_norm && l.norm_per_head) {
      for (int64_t hd = 0; hd < (g1 - g0) * group; ++hd) rms_norm(qm + hd * Dh, Dh, l.q_norm, eps, qm + hd * Dh);
      for (int64_t hd = 0; hd < g1 - g0; ++hd) rms_norm(km + hd * Dh, Dh, l.k_norm, eps, km + hd * Dh);
    }
    rope(qm, (g1 - g0) * group, pos[m]), rope(km, g1 - g0, pos[m]);
    const int64_t at = pos[m] * kv + g0 * Dh, n = (g1 - g0) * Dh;
    std::copy_n(km, n, &keys[at_slot[m]][layer][at]);
    std::copy_n(&v[m * kv + g0 * Dh], n, &values[at_slot[m]][layer][at]);
  }
  if (Hkv % team.size) team.sync();  // attend shares (run, head) items instead
  attend(team, layer, at_slot);
  team.sync();
  times(team, l.o, att.data(), M, y.data());
  const auto [c0, c1] = team.columns(D);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = c0; c < c1; ++c) x[m * D + c] += y[m * D + c];
}

// att = softmax(q k^T / sqrt(Dh)) v per (row, head), over the row's own keys; query head h reads
// kv head h / (Hq / Hkv). The work items: runs of at most kAttendRows rows of one slot at
// consecutive positions (a prompt's rows, or a decoding row alone) times the kv heads: this thread's
// own heads when every thread owns as many, else a share of all items. An item's
// dot products are one row-kernel product, [rows x heads of the group, Dh] by the keys up to its
// last row's position (a 512-token quickstart prompt: 43 -> 36-37 ms, AVX-512 EPYC, docs/benchmarks.md);
// each row then reads only its own positions' scores, and the kernel's sum for a score does not
// depend on the other rows, so a prompt in one step still equals it token by token.
void DecodeEngine::Impl::attend(const Team& team, size_t layer, const std::vector<int64_t>& at_slot) {
  const int64_t qw = Hq * Dh, kv = Hkv * Dh, group = Hq / Hkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(Dh));
  thread_local std::vector<float> qs, p;
  const bool own = Hkv % team.size == 0;
  const int64_t g0 = own ? team.share(Hkv).first : 0, heads = own ? team.share(Hkv).second - g0 : Hkv;
  const auto items = static_cast<int64_t>(runs.size()) * heads;
  const auto [i0, i1] = own ? std::pair<int64_t, int64_t>{0, items} : team.share(items);
  for (int64_t i = i0; i < i1; ++i) {
    const auto [m0, m1] = runs[i / heads];
    const int64_t g = g0 + i % heads, rows = (m1 - m0) * group, S = pos[m1 - 1] + 1, slot = at_slot[m0];
    const float* key = keys[slot][layer].data() + g * Dh;
    const float* value = values[slot][layer].data() + g * Dh;
    qs.resize(rows * Dh), p.resize(rows * S);
    for (int64_t m = m0; m < m1; ++m) std::copy_n(&q[m * qw + g * group * Dh], group * Dh, &qs[(m - m0) * group * Dh]);
    rows_part(qs.data(), Dh, rows, Dh, key, kv, 0, S, p.data(), S);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t m = m0 + r / group, hd = g * group + r % group;
      softmax_values(&p[r * S], value, pos[m] + 1, Dh, kv, scale, &att[m * qw + hd * Dh]);
    }
  }
}

// this thread's share of the rows: h = rmsnorm(x), the router's picks (picks) and the shared
// expert's gate
void DecodeEngine::Impl::route(const Team& team, const Layer& l, int64_t M) {
  auto& r = routed[team.id];
  const int64_t E = l.moe ? l.router.w.N : 0;
  r.score.resize(E), r.order.resize(E);
  for (auto [m, m1] = team.share(M); m < m1; ++m) {
    rms_norm(&x[m * D], D, l.norm_post, eps, &h[m * D]);
    if (l.moe) {
      times(l.router.w, &h[m * D], 1, &logits[m * E], 0, E);
      l.router.pick(&logits[m * E], r.score, r.order, picks[m]);
    }
    if (l.shared_gate.N > 0) {
      times(l.shared_gate, &h[m * D], 1, &shared_gate[m], 0, 1);
      shared_gate[m] = 1.0f / (1.0f + std::exp(-shared_gate[m]));
    }
  }
}

// x += ffn(rmsnorm(x)): the dense FFN, or sum_k w_k expert_k (+ gate * shared expert), each chosen
// expert run once on the rows that chose it; every thread groups the pairs itself and computes its
// columns of each product, activation and sum
void DecodeEngine::Impl::feed_forward(const Team& team, const Layer& l, int64_t M) {
  team.sync();
  route(team, l, M);
  team.sync();
  auto& r = routed[team.id];
  if (l.moe) r.group(picks, M, l.router.w.N, h.data(), D);
  const int64_t E = l.moe ? l.router.w.N : 1, F = l.units[0].gate.N, P = l.moe ? r.pairs() : M;
  auto rows = [&](int64_t e) { return l.moe ? r.rows(e) : M; };
  auto first = [&](int64_t e) { return l.moe ? r.first(e) : 0; };
  const float* in = l.moe ? r.in.data() : h.data();
  const auto [f0, f1] = team.columns(F);
  for (int64_t e = 0; e < E; ++e) {
    times(l.units[e].gate, in + first(e) * D, rows(e), &g[first(e) * F], f0, f1);
    if (l.units[e].up.N) times(l.units[e].up, in + first(e) * D, rows(e), &u[first(e) * F], f0, f1);
  }
  activate(g.data(), l.units[0].up.N ? u.data() : nullptr, P, F, f0, f1);
  if (l.shared) {
    const int64_t Fs = l.shared->gate.N;
    const auto [s0, s1] = team.columns(Fs);
    times(l.shared->gate, h.data(), M, shared_g.data(), s0, s1);
    if (l.shared->up.N) times(l.shared->up, h.data(), M, shared_u.data(), s0, s1);
    activate(shared_g.data(), l.shared->up.N ? shared_u.data() : nullptr, M, Fs, s0, s1);
  }
  team.sync();
  float* out = l.moe ? part.data() : y.data();
  for (int64_t e = 0; e < E; ++e) times(team, l.units[e].down, &g[first(e) * F], rows(e), out + first(e) * D);
  if (l.shared) times(team, l.shared->down, shared_g.data(), M, shared_part.data());
  combine(team, l, M);
}

// this thread's columns of y = sum over pairs of w * part (pairs in unit order) + gate * the shared
// expert's, then x += y
void DecodeEngine::Impl::combine(const Team& team, const Layer& l, int64_t M) {
  const auto [c0, c1] = team.columns(D);
  const auto& r = routed[team.id];
  if (l.moe) {
    for (int64_t m = 0; m < M; ++m) std::fill(&y[m * D + c0], &y[m * D + c1], 0.0f);
    for (int64_t p = 0; p < r.pairs(); ++p)
      for (int64_t c = c0; c < c1; ++c) y[r.row[p] * D + c] += r.weight[p] * part[p * D + c];
  }
  for (int64_t m = 0; l.shared && m < M; ++m) {
    const float gate = l.shared_gate.N > 0 ? shared_gate[m] : 1.0f;
    for (int64_t c = c0; c < c1; ++c) y[m * D + c] += gate * shared_part[m * D + c];
  }
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = c0; c < c1; ++c) x[m * D + c] += y[m * D + c];
}

// every block, the final norm and the head on the M rows of x -> out [M, V]
void DecodeEngine::Impl::run(const Team& team, const std::vector<int64_t>& at_slot, int64_t M, float* out) {
  for (size_t l = 0; l < layers.size(); ++l) {
    attention(team, layers[l], l, at_slot, M);
    feed_forward(team, layers[l], M);
  }
  team.sync();
  for (auto [i, i1] = team.share(static_cast<int64_t>(last.size())); i < i1; ++i)
    rms_norm(&x[last[i] * D], D, final_norm, eps, &h_last[i * D]);
  team.sync();
  times(team, head, h_last.data(), static_cast<int64_t>(last.size()), out);
}

at::Tensor DecodeEngine::step(const std::vector<int64_t>& at_slot, const std::vector<int64_t>& tokens) {
  auto& s = *impl_;
  const auto M = static_cast<int64_t>(at_slot.size());
  TORCH_CHECK(M > 0 && M <= s.rows && tokens.size() == at_slot.size(), "decode engine: ", M, " rows, ", tokens.size(),
              " tokens (a step takes at most ", s.rows, " rows)");
  s.pos.resize(M), s.last.clear();
  for (int64_t m = 0; m < M; ++m) {
    const int64_t slot = at_slot[m];
    TORCH_CHECK(slot >= 0 && slot < s.slots, "decode engine: slot ", slot, " is not one of ", s.slots);
    s.pos[m] = s.length[slot] + std::count(at_slot.begin(), at_slot.begin() + m, slot);
    TORCH_CHECK(s.pos[m] < s.max_len, "sequence position ", s.pos[m], " reaches model.max_seq_len ", s.max_len);
    TORCH_CHECK(tokens[m] >= 0 && tokens[m] < s.V, "token id ", tokens[m], " outside the vocabulary of ", s.V);
    if (std::find(at_slot.begin() + m + 1, at_slot.end(), slot) == at_slot.end()) s.last.push_back(m);
    weight_row(s.embed, tokens[m], &s.x[m * s.D]);
  }
  const int64_t kv = s.Hkv * s.Dh;
  for (int64_t m = 0; m < M; ++m)  // room for the rows' keys and values, which their heads' threads write
    for (auto* cache : {&s.keys[at_slot[m]], &s.values[at_slot[m]]})
      for (auto& layer : *cache) layer.resize(std::max<size_t>(layer.size(), (s.pos[m] + 1) * kv));
  s.runs.clear();
  for (int64_t m = 0; m < M; ++m)
    if (m == 0 || at_slot[m] != at_slot[m - 1] || m - s.runs.back().first == kAttendRows)
      s.runs.emplace_back(m, m + 1);
    else
      s.runs.back().second = m + 1;
  auto logits = at::empty({static_cast<int64_t>(s.last.size()), s.V}, at::TensorOptions().dtype(at::kFloat));
  float* out = logits.data_ptr<float>();
  const int threads = at::in_parallel_region() ? 1 : at::get_num_threads();
  if (static_cast<int>(s.routed.size()) < threads) s.routed.resize(threads);
  if (threads <= 1) {
    s.run(Team{}, at_slot, M, out);
  } else {
#pragma omp parallel num_threads(threads)
    s.run(Team{omp_get_thread_num(), omp_get_num_threads(), &s.barrier}, at_slot, M, out);
  }
  for (int64_t m = 0; m < M; ++m) s.length[at_slot[m]] = s.pos[m] + 1;
  return logits;
}

}  // namespace mf
