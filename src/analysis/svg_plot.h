// Minimal SVG line charts (loss curves). Hand-written because Debian has no small C++
// plotting library; SVG is text, so a chart is ~100 lines and needs no dependencies.
#pragma once
#include <string>
#include <vector>

namespace mf {

struct Series {
  std::string name;
  std::vector<double> x, y;
  bool dashed = false;
};

struct ChartOptions {
  std::string title, x_label, y_label;
  int width = 760, height = 440;
};

std::string line_chart_svg(const std::vector<Series>& series, const ChartOptions& opt);

// Reads RUN_DIR/metrics.jsonl and writes RUN_DIR/loss.svg (train loss + per-domain
// validation loss against step). Returns the written path.
std::string plot_run_losses(const std::string& run_dir);

}  // namespace mf
