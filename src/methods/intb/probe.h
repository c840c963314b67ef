// IntBMoE's probes on a trained model (../shared/specs/intbmoe.md, "Expert-removal probe"):
// remove basis e from every composition of one slot (1/sqrt(E) -> 1/sqrt(E-1)) and evaluate
// without retraining, for every slot and basis; and the pairwise cosine similarity of the
// blocks' recipes [alpha^v_b, alpha^g_b] per slot.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "train/evaluable.h"

namespace mf {

struct IntBProbe {
  std::string split;
  double loss = 0;                                           // the intact model
  std::vector<int64_t> layers;                               // block index of each IntBMoE slot
  std::vector<std::vector<double>> removed;                  // [slot][basis] loss with that basis removed
  std::vector<std::vector<std::vector<double>>> similarity;  // [slot] K x K cosine of the recipes
  double mean_similarity(size_t slot) const;                 // over the pairs b != b'
  std::string markdown() const;
  nlohmann::json to_json() const;
  static IntBProbe from_json(const nlohmann::json& j);  // to_json()'s inverse
};

IntBProbe intb_probe(Evaluable& model, const std::string& split);
// removal.svg (slot x basis loss increase) and similarity.svg (one row per slot: its pairs); paths
std::vector<std::string> write_intb_probe(const IntBProbe& p, const std::string& prefix, const std::string& run);

}  // namespace mf
