// The confusion matrix `eval` prints and draws (analysis/confusion), by hand.
#include <gtest/gtest.h>

#include <stdexcept>

#include "analysis/confusion.h"

using namespace mf;

TEST(Confusion, CountsAccuracyAndSharesByHand) {
  // true 0 0 1 1 1 2, predicted 0 1 1 1 0 2
  const auto c = confusion_matrix({0, 0, 1, 1, 1, 2}, {0, 1, 1, 1, 0, 2}, 4);
  const std::vector<std::vector<double>> counts = {{1, 1, 0, 0}, {1, 2, 0, 0}, {0, 0, 1, 0}, {0, 0, 0, 0}};
  EXPECT_EQ(c.counts, counts);
  EXPECT_DOUBLE_EQ(c.images(1), 3);
  EXPECT_DOUBLE_EQ(c.accuracy(0), 0.5);
  EXPECT_DOUBLE_EQ(c.accuracy(1), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(c.accuracy(2), 1.0);
  EXPECT_DOUBLE_EQ(c.accuracy(3), 0.0);  // no images of class 3
  const auto shares = c.row_shares();
  EXPECT_DOUBLE_EQ(shares[1][0], 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(shares[1][1], 2.0 / 3.0);
  EXPECT_EQ(shares[3], std::vector<double>(4, 0.0));
  const auto svg = confusion_svg(c, {"tee", "trouser", "pullover", "dress"}, "toy");
  EXPECT_NE(svg.find("trouser"), std::string::npos);
  EXPECT_NE(svg.find("predicted class"), std::string::npos);
}

TEST(Confusion, RefusesMismatchedOrOutOfRangeClasses) {
  EXPECT_THROW(confusion_matrix({0, 1}, {0}, 2), std::invalid_argument);
  EXPECT_THROW(confusion_matrix({0, 2}, {0, 1}, 2), std::invalid_argument);
  EXPECT_THROW(confusion_matrix({0, 1}, {0, -1}, 2), std::invalid_argument);
}
