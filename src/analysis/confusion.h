// The confusion matrix of a classifier's predictions: rows are the true classes, columns the
// predicted ones; `eval` prints each class's accuracy and draws the rows' shares.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mf {

struct Confusion {
  std::vector<std::vector<double>> counts;  // [true][predicted] images
  double images(int64_t k) const;           // of true class k
  double accuracy(int64_t k) const;         // share of class k predicted as k (0 without images)
  std::vector<std::vector<double>> row_shares() const;
};

Confusion confusion_matrix(const std::vector<int64_t>& labels, const std::vector<int64_t>& predictions,
                           int64_t classes);

// A heatmap of the row shares, rows and columns named by `names`.
std::string confusion_svg(const Confusion& c, const std::vector<std::string>& names, const std::string& title);

}  // namespace mf
