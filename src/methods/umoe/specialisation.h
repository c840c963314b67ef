// Whether a pretrained MoE's experts specialise by domain, before any surgery: per MoE layer,
// the routing distribution of each domain (share of its routed pairs per expert) and the mean
// Jensen-Shannon divergence between the domains' distributions, in bits:
//   JSD(p, q) = 1/2 KL(p || m) + 1/2 KL(q || m),  m = (p + q) / 2,  KL in log2, 0 log 0 = 0
// 0 when every domain routes alike, 1 when two domains use disjoint experts.
#pragma once
#include <cstdint>
#include <vector>

namespace mf {

// Of two count (or probability) vectors, each normalised to sum 1 first.
double js_divergence(const std::vector<double>& p, const std::vector<double>& q);

// counts[domain][layer][expert] -> per layer, the mean JSD over the domain pairs.
std::vector<double> domain_divergence(const std::vector<std::vector<std::vector<double>>>& counts);

}  // namespace mf
