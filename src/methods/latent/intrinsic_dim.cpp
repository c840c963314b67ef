#include "methods/latent/intrinsic_dim.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/util.h"

namespace mf {

double twonn_dimension(const at::Tensor& X_in, double discard) {
  torch::NoGradGuard g;
  // exact duplicates would be each other's neighbour (r1 = 0) and make r1 = r2 for their
  // neighbours (mu = 1), biasing the fit: TwoNN runs on the distinct points
  auto X = std::get<0>(torch::unique_dim(X_in.to(torch::kDouble), 0));
  const int64_t n = X.size(0);
  TORCH_CHECK(n >= 3, "TwoNN needs at least 3 points");
  std::vector<double> mu;
  const auto sq = (X * X).sum(1);
  for (int64_t s = 0; s < n; s += 1024) {  // distance rows in chunks: n x n does not fit for large n
    const int64_t b = std::min<int64_t>(1024, n - s);
    auto d2 = (sq.narrow(0, s, b).unsqueeze(1) + sq.unsqueeze(0) - 2 * X.narrow(0, s, b).matmul(X.t())).clamp_min(0);
    d2.narrow(1, s, b).fill_diagonal_(std::numeric_limits<double>::infinity());  // exclude the point itself
    // the expanded form cancels badly for near-identical points: take 3 candidates from it, then
    // measure their distances directly so duplicates give exactly r1 = 0 (and are dropped)
    auto cand = std::get<1>(d2.topk(std::min<int64_t>(3, n - 1), 1, /*largest=*/false));
    auto rows = X.narrow(0, s, b).unsqueeze(1);
    auto exact =
        std::get<0>((X.index_select(0, cand.reshape({-1})).view({b, cand.size(1), -1}) - rows).norm(2, -1).sort(1))
            .contiguous();
    auto* p = exact.data_ptr<double>();
    const int64_t w = exact.size(1);
    for (int64_t i = 0; i < b; ++i)
      if (p[w * i] > 0) mu.push_back(p[w * i + 1] / p[w * i]);
  }
  TORCH_CHECK(mu.size() >= 3, "TwoNN: too few distinct points");
  std::sort(mu.begin(), mu.end());
  const auto m = static_cast<double>(mu.size());
  const auto keep = static_cast<size_t>(std::floor(m * (1 - discard)));
  double sxy = 0, sxx = 0;
  for (size_t i = 0; i < keep; ++i) {
    const double x = std::log(mu[i]), y = -std::log(1 - static_cast<double>(i + 1) / m);
    sxy += x * y;
    sxx += x * x;
  }
  return sxx > 0 ? sxy / sxx : 0;
}

IdProfile intrinsic_dimension_profile(TransformerLM& model, const PreparedCorpus& corpus, const std::string& split,
                                      int64_t seq_len, int64_t collect, int64_t keep, uint64_t seed) {
  torch::NoGradGuard g;
  model->eval();
  const int64_t per_domain =
      (collect + static_cast<int64_t>(corpus.domains().size()) - 1) / static_cast<int64_t>(corpus.domains().size());
  const int64_t windows = std::max<int64_t>(1, (per_domain + seq_len - 1) / seq_len);
  std::vector<std::vector<at::Tensor>> reps;  // [block][batch] -> [tokens, d]
  for (size_t dom = 0; dom < corpus.domains().size(); ++dom) {
    auto batch = fixed_windows(corpus.tokens(dom, split), seq_len, windows);
    for (int64_t b = 0; b < windows; b += 16) {
      std::vector<at::Tensor> outs;
      AuxLosses aux;
      model->forward(batch.inputs.narrow(0, b, std::min<int64_t>(16, windows - b)), aux, nullptr, &outs);
      reps.resize(outs.size());
      for (size_t k = 0; k < outs.size(); ++k) reps[k].push_back(outs[k].reshape({-1, outs[k].size(-1)}));
    }
  }
  IdProfile p;
  SplitMix64 rng(seed);
  std::vector<int64_t> idx;
  for (size_t k = 0; k < reps.size(); ++k) {
    auto all = torch::cat(reps[k]);
    if (k == 0) {  // the same tokens for every block: a seeded partial Fisher-Yates draw
      p.tokens_collected = all.size(0);
      std::vector<int64_t> perm(static_cast<size_t>(all.size(0)));
      std::iota(perm.begin(), perm.end(), 0);
      const auto n = std::min<int64_t>(keep, all.size(0));
      for (int64_t i = 0; i < n; ++i)
        std::swap(perm[static_cast<size_t>(i)],
                  perm[static_cast<size_t>(i + static_cast<int64_t>(rng.below(perm.size() - i)))]);
      idx.assign(perm.begin(), perm.begin() + n);
      p.tokens_used = n;
    }
    p.id.push_back(twonn_dimension(all.index_select(0, torch::tensor(idx, torch::kLong))));
  }
  return p;
}

int64_t two_segment_split(const std::vector<double>& id) {
  int64_t best = -1;
  double best_gap = 0;
  for (size_t s = 1; s < id.size(); ++s) {
    const double lo = *std::max_element(id.begin(), id.begin() + s), hi = *std::min_element(id.begin() + s, id.end());
    if (lo < hi && (best < 0 || hi - lo > best_gap)) {
      best = static_cast<int64_t>(s);
      best_gap = hi - lo;
    }
  }
  return best;
}

}  // namespace mf
