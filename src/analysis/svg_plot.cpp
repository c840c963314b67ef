#include "analysis/svg_plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>

#include "core/util.h"
#include "train/metrics.h"

namespace mf {
namespace {

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};

// 1-2-5 tick spacing giving about `target` ticks over [lo, hi]
double nice_step(double lo, double hi, int target) {
  double raw = (hi - lo) / std::max(1, target);
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) return m * mag;
  return 10 * mag;
}

}  // namespace

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s)
    o += c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;" : c == '"' ? "&quot;" : std::string(1, c);
  return o;
}

static std::string svg_header(int width, int height, double title_x, const std::string& title);

std::string line_chart_svg(const std::vector<Series>& series, const ChartOptions& opt) {
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (auto& s : series)
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.y[i])) continue;
      x0 = std::min(x0, s.x[i]);
      x1 = std::max(x1, s.x[i]);
      y0 = std::min(y0, s.y[i]);
      y1 = std::max(y1, s.y[i]);
    }
  if (!(x1 > x0)) {  // a flat or empty range gets a width of 2 around it
    x0 = (std::isfinite(x0) ? x0 : 0) - 1;
    x1 = x0 + 2;
  }
  if (!(y1 > y0)) {
    y0 = (std::isfinite(y0) ? y0 : 0) - 1;
    y1 = y0 + 2;
  }
  const double L = 64, R = 170, T = 36, B = 48;
  const double pw = opt.width - L - R, ph = opt.height - T - B;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return T + (1 - (y - y0) / (y1 - y0)) * ph; };

  size_t longest = 0;  // the legend gets the room its longest name needs (~7 px a character)
  for (auto& s : series) longest = std::max(longest, s.name.size());
  const int width = opt.width + static_cast<int>(std::max(0.0, 7.0 * static_cast<double>(longest) - (R - 46)));
  std::string svg = svg_header(width, opt.height, L + pw / 2, opt.title);
  for (double v = std::ceil(y0 / nice_step(y0, y1, 6)) * nice_step(y0, y1, 6); v <= y1 + 1e-12;
       v += nice_step(y0, y1, 6))
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{:g}</text>\n",
        L, py(v), L + pw, py(v), L - 6, py(v) + 4, v);
  for (double v = std::ceil(x0 / nice_step(x0, x1, 8)) * nice_step(x0, x1, 8); v <= x1 + 1e-12;
       v += nice_step(x0, x1, 8))
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#eee\"/>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{:g}</text>\n",
        px(v), T, px(v), T + ph, px(v), T + ph + 16, v);
  svg +=
      fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#444\"/>\n", L, T, pw, ph);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", L + pw / 2, opt.height - 10,
                     xml_escape(opt.x_label));
  svg += fmt::format("<text transform=\"translate(16,{}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n", T + ph / 2,
                     xml_escape(opt.y_label));
  for (size_t k = 0; k < series.size(); ++k) {
    const auto& s = series[k];
    const char* color = kColors[k % (sizeof kColors / sizeof *kColors)];
    std::string pts;
    for (size_t i = 0; i < s.x.size(); ++i)
      if (std::isfinite(s.y[i])) {
        if (s.points)
          svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\"/>\n", px(s.x[i]), py(s.y[i]),
                             color);
        else
          pts += fmt::format("{:.1f},{:.1f} ", px(s.x[i]), py(s.y[i]));
      }
    if (!s.points)
      svg += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"{}\"{} points=\"{}\"/>\n", color,
                         s.dashed ? 2 : 1.5, s.dashed ? " stroke-dasharray=\"6 3\"" : "", pts);
    const double ly = T + 14 + 18.0 * static_cast<double>(k);
    svg += fmt::format(
        "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"2\"{}/>"
        "<text x=\"{}\" y=\"{}\">{}</text>\n",
        L + pw + 12, ly, L + pw + 36, ly, color, s.dashed ? " stroke-dasharray=\"6 3\"" : "", L + pw + 42, ly + 4,
        xml_escape(s.name));
  }
  return svg + "</svg>\n";
}

static std::string svg_header(int width, int height, double title_x, const std::string& title) {
  return fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{}\" y=\"22\" font-size=\"15\" text-anchor=\"middle\">{}</text>\n",
      width, height, title_x, xml_escape(title));
}

static std::string blue(double t) {  // t in [0, 1]: white -> #08306b
  t = std::clamp(t, 0.0, 1.0);
  auto mix = [&](int a, int b) { return static_cast<int>(std::lround(a + (b - a) * t)); };
  return fmt::format("#{:02x}{:02x}{:02x}", mix(255, 8), mix(255, 48), mix(255, 107));
}

std::string heatmap_svg(const std::vector<std::vector<double>>& values, const HeatmapOptions& opt) {
  const size_t rows = values.size(), cols = rows ? values[0].size() : 0;
  double vmax = opt.vmax;
  for (auto& r : values)
    for (double v : r) vmax = opt.vmax > 0 ? vmax : std::max(vmax, v);
  if (vmax <= 0) vmax = 1;
  const double L = 70, T = 36, B = 48, cell_h = std::clamp(360.0 / std::max<size_t>(1, rows), 8.0, 28.0);
  const double pw = std::clamp(8.0 * static_cast<double>(cols), 240.0, 900.0), cell_w = pw / std::max<size_t>(1, cols);
  const double ph = cell_h * static_cast<double>(rows), W = L + pw + 120, H = T + ph + B;
  std::string svg = svg_header(static_cast<int>(W), static_cast<int>(H), L + pw / 2, opt.title);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c)
      svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"{}\"/>",
                         L + cell_w * c, T + cell_h * r, cell_w + 0.05, cell_h + 0.05, blue(values[r][c] / vmax));
    std::string label = r < opt.row_labels.size() ? opt.row_labels[r] : std::to_string(r);
    svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", L - 6, T + cell_h * (r + 0.5) + 4,
                       xml_escape(label));
  }
  const double step = nice_step(0, static_cast<double>(cols), 10);
  for (double v = 0; v < static_cast<double>(cols); v += step)
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{:g}</text>", L + cell_w * (v + 0.5),
                       T + ph + 16, v);
  svg +=
      fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#444\"/>\n", L, T, pw, ph);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", L + pw / 2, H - 10,
                     xml_escape(opt.x_label));
  svg += fmt::format("<text transform=\"translate(16,{}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n", T + ph / 2,
                     xml_escape(opt.y_label));
  for (int i = 0; i < 50; ++i)  // colour bar
    svg += fmt::format("<rect x=\"{}\" y=\"{:.1f}\" width=\"14\" height=\"{:.2f}\" fill=\"{}\"/>", L + pw + 20,
                       T + ph * (49 - i) / 50.0, ph / 50.0 + 0.05, blue(i / 49.0));
  svg += fmt::format("\n<text x=\"{}\" y=\"{}\">{:.3g}</text><text x=\"{}\" y=\"{}\">0</text>", L + pw + 38, T + 10,
                     vmax, L + pw + 38, T + ph);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\">{}</text>\n", L + pw + 14, T - 6,
                     xml_escape(opt.value_label));
  return svg + "</svg>\n";
}

std::string bar_chart_svg(const std::vector<double>& values, const ChartOptions& opt, int64_t groups) {
  const double L = 64, R = 24, T = 36, B = 48, pw = opt.width - L - R, ph = opt.height - T - B;
  double vmax = 0;
  for (double v : values) vmax = std::max(vmax, v);
  if (vmax <= 0) vmax = 1;
  std::string svg = svg_header(opt.width, opt.height, L + pw / 2, opt.title);
  const double ys = nice_step(0, vmax, 5);
  for (double v = 0; v <= vmax + 1e-12; v += ys)
    svg += fmt::format(
        "<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>"
        "<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:g}</text>\n",
        L, T + ph * (1 - v / vmax), L + pw, T + ph * (1 - v / vmax), L - 6, T + ph * (1 - v / vmax) + 4, v);
  const double w = pw / std::max<size_t>(1, values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const double h = ph * values[i] / vmax;
    svg += values[i] > 0
               ? fmt::format("<rect x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"#1f77b4\"/>",
                             L + w * i, T + ph - h, std::max(w * 0.85, 0.5), h)
               : fmt::format("<rect x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"4\" fill=\"#d62728\"/>",
                             L + w * i, T + ph + 1, std::max(w * 0.85, 0.5));
  }
  const size_t per = groups > 1 ? values.size() / static_cast<size_t>(groups) : 0;
  for (size_t g = 1; per && g < static_cast<size_t>(groups); ++g)
    svg +=
        fmt::format("<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"#999\" stroke-dasharray=\"3 3\"/>",
                    L + w * per * g, T, L + w * per * g, T + ph);
  svg += fmt::format("\n<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#444\"/>\n", L, T, pw,
                     ph);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", L + pw / 2, opt.height - 10,
                     xml_escape(opt.x_label));
  svg += fmt::format("<text transform=\"translate(16,{}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n", T + ph / 2,
                     xml_escape(opt.y_label));
  return svg + "</svg>\n";
}

std::string plot_run_losses(const std::string& run_dir) {
  Series train{"train loss", {}, {}};
  std::map<std::string, Series> val;
  for (auto& r : read_metrics((std::filesystem::path(run_dir) / "metrics.jsonl").string())) {
    double step = r.value("step", 0.0);
    if (r.contains("loss")) train.x.push_back(step), train.y.push_back(r["loss"].get<double>());
    if (r.contains("val_loss"))
      for (auto& [dom, v] : r["val_loss"].items()) {
        auto& s = val[dom];
        s.name = "val " + dom;
        s.dashed = true;
        s.x.push_back(step), s.y.push_back(v.get<double>());
      }
  }
  std::vector<Series> all = {train};
  for (auto& [dom, s] : val) all.push_back(s);
  auto path = (std::filesystem::path(run_dir) / "loss.svg").string();
  write_file_atomic(path, line_chart_svg(all, {"loss — " + std::filesystem::path(run_dir).filename().string(),
                                               "optimizer step", "cross entropy (nats)"}));
  return path;
}

}  // namespace mf
