// Minimal SVG line charts (loss curves). Hand-written because Debian has no small C++
// plotting library; SVG is text, so a chart is ~100 lines and needs no dependencies.
#pragma once
#include <string>
#include <vector>

namespace mf {

// &, <, > and " as entities: text for SVG or HTML.
std::string xml_escape(const std::string& s);

struct Series {
  std::string name;
  std::vector<double> x, y;
  bool dashed = false;
  bool points = false;  // a scatter: one dot per (x, y), no line
};

struct ChartOptions {
  std::string title, x_label, y_label;
  int width = 760, height = 440;
};

std::string line_chart_svg(const std::vector<Series>& series, const ChartOptions& opt);

// Rows x columns of values in [0, vmax], white -> dark blue, with a colour bar.
struct HeatmapOptions {
  std::string title, x_label, y_label, value_label;
  std::vector<std::string> row_labels;
  double vmax = 0;  // 0 = the largest value
};
std::string heatmap_svg(const std::vector<std::vector<double>>& values, const HeatmapOptions& opt);

// One bar per value (zero bars marked red below the axis); `groups` > 1 draws separators
// every values.size() / groups bars.
std::string bar_chart_svg(const std::vector<double>& values, const ChartOptions& opt, int64_t groups = 1);

// Reads RUN_DIR/metrics.jsonl and writes RUN_DIR/loss.svg (train loss + per-domain
// validation loss against step). Returns the written path.
std::string plot_run_losses(const std::string& run_dir);

}  // namespace mf
