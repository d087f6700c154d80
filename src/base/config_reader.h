// Strict reading of JSON config objects: wrong types, out-of-range values and unknown keys
// are errors that name the full key (e.g. "model.d_model").
#pragma once
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/error.h"

namespace foundry {

using json = nlohmann::json;

class ConfigReader {
 public:
  // `where` names the file for messages; `prefix` is the key path of `obj` ("" or "model.");
  // `hint` is what the hint of a wrong type or value says (default: fix it in the config or
  // with --set; files written by Foundry itself say how to write them again).
  ConfigReader(const json& obj, std::string where, std::string prefix = "", std::string hint = "");

  // Reads `key` into `out` if present; leaves the default otherwise.
  template <typename T>
  void get(const std::string& key, T& out) {
    seen_.insert(key);
    auto it = obj_.find(key);
    if (it == obj_.end()) return;
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      // Before any conversion: a float such as 1e30 does not fit T (UB to convert).
      if (!it->is_number_integer() && !it->is_number_unsigned())
        type_error(key, *it, type_name<T>());
      // The value as written, not as it wrapped into T (a seed of -1 is no seed of 2^64 - 1).
      using Limits = std::numeric_limits<T>;
      const bool fits =
          it->is_number_unsigned()
              ? it->template get<uint64_t>() <= static_cast<uint64_t>(Limits::max())
              : (it->template get<int64_t>() >= 0
                     ? static_cast<uint64_t>(it->template get<int64_t>()) <=
                           static_cast<uint64_t>(Limits::max())
                     : std::is_signed_v<T> &&
                           it->template get<int64_t>() >= static_cast<int64_t>(Limits::min()));
      if (!fits)
        fail(fmt::format("{}: '{}{}' = {} is out of range [{}, {}]", where_, prefix_, key,
                         it->dump(), Limits::min(), Limits::max()),
             hint_);
    }
    try {
      out = it->template get<T>();
    } catch (const std::exception&) {
      type_error(key, *it, type_name<T>());
    }
  }

  // Like get(), then checks lo <= value <= hi.
  template <typename T>
  void get(const std::string& key, T& out, T lo, T hi) {
    get(key, out);
    if (out < lo || out > hi)
      fail(fmt::format("{}: '{}{}' = {} is out of range [{}, {}]", where_, prefix_, key, out, lo,
                       hi),
           hint_);
  }

  // One of a fixed set of strings.
  void get_choice(const std::string& key, std::string& out,
                  const std::vector<std::string>& allowed);
  // A choice of typed values by name: the config's name selects the value (errors list the
  // names); absent, `out` keeps its default.
  template <typename T>
  void get_choice(const std::string& key, T& out,
                  const std::vector<std::pair<std::string, T>>& choices) {
    std::string name;
    std::vector<std::string> names;
    for (const auto& [n, v] : choices) {
      names.push_back(n);
      if (v == out) name = n;
    }
    get_choice(key, name, names);
    for (const auto& [n, v] : choices)
      if (n == name) out = v;
  }
  // A typed value by name through `parse` (std::optional<T>(std::string_view), empty for a
  // name it does not know); an unknown name is an error listing `names`. Absent, `out` keeps
  // its default.
  template <typename T, typename Parse>
  void get_parsed(const std::string& key, T& out, Parse parse, const std::string& names) {
    seen_.insert(key);
    if (!obj_.contains(key)) return;
    std::string name;
    get(key, name);
    const std::optional<T> value = parse(name);
    if (!value) not_one_of(key, name, names);
    out = *value;
  }

  // Marks a nested object key as known and returns it (or an empty object).
  const json& child(const std::string& key);

  // Fails on any key that was never asked for.
  void finish() const;

  const std::string& where() const { return where_; }

 private:
  template <typename T>
  static const char* type_name() {
    if constexpr (std::is_same_v<T, bool>) return "a boolean";
    else if constexpr (std::is_integral_v<T>) return "an integer";
    else if constexpr (std::is_floating_point_v<T>) return "a number";
    else if constexpr (std::is_same_v<T, std::string>) return "a string";
    else return "a value of the right type";
  }
  [[noreturn]] void type_error(const std::string& key, const json& value,
                               const char* expected) const;
  [[noreturn]] void not_one_of(const std::string& key, const std::string& value,
                               const std::string& names) const;

  const json& obj_;
  std::string where_, prefix_, hint_;
  std::set<std::string> seen_;
};

// Loads a JSON file; a parse error names the file, line and column.
json load_json_file(const std::string& path);

// Parses JSON text (json::parse_error on bad syntax); `repeated` gets the first key written
// twice in one object ("train" or "model.d_model"; "" when none), whose earlier value JSON
// would drop without a word.
json parse_json_noting_repeats(const std::string& text, std::string& repeated);

// Applies "a.b.c=value" to a JSON object. The value is parsed as JSON when it parses
// (numbers, true/false, quoted strings, arrays); otherwise it is taken as a plain string.
// The key must already exist unless `allow_new` is set, so typos are caught here.
void apply_override(json& root, const std::string& assignment, bool allow_new = false);

}  // namespace foundry
