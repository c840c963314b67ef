// A result table: rows of named values, printed as aligned text and written as the same rows in
// JSON, so a command's printed table and its --json file cannot disagree.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace mf {

class ResultTable {
 public:
  struct Column {
    std::string key;     // the JSON key
    std::string title;   // the printed header
    std::string format;  // fmt spec of the printed value, e.g. "{:.1f}" or "{:.2f}x"; "" = as is
    int width = 10;      // negative: left-aligned
  };
  explicit ResultTable(std::vector<Column> columns) : columns_(std::move(columns)) {}
  // A row by column key; extra keys go to the JSON only. A row with a "note" prints its first two
  // cells and the note (e.g. why a case did not run).
  void add(nlohmann::json row) { rows_.push_back(std::move(row)); }
  std::string text() const;
  const nlohmann::json& json() const { return rows_; }

 private:
  std::vector<Column> columns_;
  nlohmann::json rows_ = nlohmann::json::array();
};

}  // namespace mf
