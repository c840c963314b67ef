#include "analysis/confusion.h"

#include <fmt/format.h>

#include <numeric>
#include <stdexcept>

#include "analysis/svg_plot.h"

namespace mf {

double Confusion::images(int64_t k) const {
  const auto& row = counts.at(static_cast<size_t>(k));
  return std::accumulate(row.begin(), row.end(), 0.0);
}

double Confusion::accuracy(int64_t k) const {
  const double n = images(k);
  return n > 0 ? counts[static_cast<size_t>(k)][static_cast<size_t>(k)] / n : 0.0;
}

std::vector<std::vector<double>> Confusion::row_shares() const {
  auto shares = counts;
  for (size_t k = 0; k < shares.size(); ++k) {
    const double n = images(static_cast<int64_t>(k));
    for (auto& v : shares[k]) v = n > 0 ? v / n : 0;
  }
  return shares;
}

Confusion confusion_matrix(const std::vector<int64_t>& labels, const std::vector<int64_t>& predictions,
                           int64_t classes) {
  if (labels.size() != predictions.size())
    throw std::invalid_argument(
        fmt::format("confusion matrix: {} labels for {} predictions", labels.size(), predictions.size()));
  const auto K = static_cast<size_t>(classes);
  Confusion c{std::vector<std::vector<double>>(K, std::vector<double>(K, 0))};
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] < 0 || labels[i] >= classes || predictions[i] < 0 || predictions[i] >= classes)
      throw std::invalid_argument(fmt::format("confusion matrix: image {} has label {} and prediction {} outside 0..{}",
                                              i, labels[i], predictions[i], classes - 1));
    c.counts[static_cast<size_t>(labels[i])][static_cast<size_t>(predictions[i])] += 1;
  }
  return c;
}

std::string confusion_svg(const Confusion& c, const std::vector<std::string>& names, const std::string& title) {
  HeatmapOptions h;
  h.row_labels = names;
  h.title = title;
  h.x_label = "predicted class";
  h.y_label = "true class";
  h.value_label = "share of the true class";
  return heatmap_svg(c.row_shares(), h);
}

}  // namespace mf
