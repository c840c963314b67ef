#include "core/table.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

namespace mf {
namespace {

std::string pad(const std::string& s, int width) {
  const auto w = static_cast<size_t>(std::abs(width));
  if (s.size() >= w) return s;
  return width < 0 ? s + std::string(w - s.size(), ' ') : std::string(w - s.size(), ' ') + s;
}

std::string cell(const nlohmann::json& v, const std::string& format) {
  if (v.is_null()) return "-";
  if (v.is_string())
    return format.empty() ? v.get<std::string>() : fmt::format(fmt::runtime(format), v.get<std::string>());
  if (format.empty()) return v.dump();
  if (v.is_number_integer()) return fmt::format(fmt::runtime(format), v.get<int64_t>());
  return fmt::format(fmt::runtime(format), v.get<double>());
}

}  // namespace

std::string ResultTable::text() const {
  const auto line = [&](size_t columns, const auto& value) {
    std::string out;
    for (size_t i = 0; i < columns; ++i) out += (i ? " " : "") + pad(value(columns_[i]), columns_[i].width);
    return out;
  };
  std::string out = line(columns_.size(), [](const Column& c) { return c.title; }) + "\n";
  for (const auto& row : rows_) {
    const auto value = [&](const Column& c) { return cell(row.value(c.key, nlohmann::json()), c.format); };
    if (row.contains("note"))  // the row's identity (its first two cells), then why it has no figures
      out += line(std::min<size_t>(2, columns_.size()), value) + " " + row["note"].get<std::string>() + "\n";
    else
      out += line(columns_.size(), value) + "\n";
  }
  return out;
}

}  // namespace mf
