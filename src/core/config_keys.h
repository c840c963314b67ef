// Helpers for declaring config keys: the core schema (config_schema.cpp) and the methods'
// sub-tables use the same ones.
#pragma once
#include <limits>
#include <type_traits>

#include "core/config.h"

namespace mf {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A key whose value lives at ref(config), a T& (bool, int64_t, double or std::string).
// lo <= hi enables the inclusive range check; `choices` restricts a string.
template <class T, class Ref>
KeySpec key_at(const char* path, Ref ref, const char* help, double lo = 1, double hi = 0,
               std::vector<std::string> choices = {}) {
  KeySpec s;
  s.path = path;
  s.help = help;
  s.min = lo;
  s.max = hi;
  s.choices = std::move(choices);
  if constexpr (std::is_same_v<T, bool>)
    s.type = ValueType::Bool;
  else if constexpr (std::is_same_v<T, int64_t>)
    s.type = ValueType::Int;
  else if constexpr (std::is_same_v<T, double>)
    s.type = ValueType::Float;
  else
    s.type = ValueType::String;
  s.get = [ref](const Config& c) -> Value { return Value(ref(const_cast<Config&>(c))); };
  s.set = [ref](Config& c, const Value& v) { ref(c) = std::get<T>(v); };
  return s;
}

// A string key stored as an enum E whose names (in enum order) are `names`.
template <class E, class Ref>
KeySpec enum_key_at(const char* path, Ref ref, const char* help, const std::vector<std::string>& names) {
  KeySpec s;
  s.path = path;
  s.help = help;
  s.type = ValueType::String;
  s.choices = names;
  s.get = [ref, names](const Config& c) -> Value {
    return Value(names.at(static_cast<size_t>(ref(const_cast<Config&>(c)))));
  };
  s.set = [ref, names](Config& c, const Value& v) {
    const auto& name = std::get<std::string>(v);
    ref(c) = static_cast<E>(std::find(names.begin(), names.end(), name) - names.begin());
  };
  return s;
}

}  // namespace mf
