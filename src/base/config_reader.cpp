#include "base/config_reader.h"

#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "base/io.h"

namespace foundry {

ConfigReader::ConfigReader(const json& obj, std::string where, std::string prefix,
                           std::string hint)
    : obj_(obj),
      where_(std::move(where)),
      prefix_(std::move(prefix)),
      hint_(hint.empty() ? "fix the value in the config or with --set" : std::move(hint)) {
  if (!obj_.is_object() && !obj_.is_null())
    fail(fmt::format("{}: '{}' must be a JSON object, got {}", where_,
                     prefix_.empty() ? "<root>" : prefix_.substr(0, prefix_.size() - 1),
                     obj_.dump()),
         hint_);
}

void ConfigReader::type_error(const std::string& key, const json& value,
                              const char* expected) const {
  // --set reads a value as JSON first: a string that reads as a number needs its quotes (said
  // only where the reader's hint is about --set: not for files Foundry wrote).
  const bool quote_hint = std::string_view(expected) == "a string" &&
                          hint_.find("--set") != std::string::npos &&
                          (value.is_number() || value.is_boolean());
  fail(fmt::format("{}: '{}{}' must be {}, got {}", where_, prefix_, key, expected, value.dump()),
       quote_hint ? fmt::format("{}; with --set, quote a string that reads as JSON: --set "
                                "'{}{}=\"{}\"'",
                                hint_, prefix_, key, value.dump())
                  : hint_);
}

void ConfigReader::get_choice(const std::string& key, std::string& out,
                              const std::vector<std::string>& allowed) {
  get(key, out);
  for (const auto& a : allowed)
    if (a == out) return;
  std::string list;
  for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
  not_one_of(key, out, list);
}

void ConfigReader::not_one_of(const std::string& key, const std::string& value,
                              const std::string& names) const {
  fail(fmt::format("{}: '{}{}' = \"{}\" is not one of: {}", where_, prefix_, key, value, names),
       "use one of the listed values");
}

const json& ConfigReader::child(const std::string& key) {
  static const json empty = json::object();
  seen_.insert(key);
  auto it = obj_.find(key);
  if (it == obj_.end()) return empty;
  return *it;
}

void ConfigReader::finish() const {
  if (!obj_.is_object()) return;
  for (auto it = obj_.begin(); it != obj_.end(); ++it) {
    if (seen_.count(it.key())) continue;
    std::string known;
    for (const auto& k : seen_) known += (known.empty() ? "" : ", ") + k;
    fail(fmt::format("{}: unknown key '{}{}'", where_, prefix_, it.key()),
         fmt::format("known keys here: {}", known));
  }
}

namespace {

// Finds a key repeated in one object while a document parses: JSON keeps only the last of
// them, so the earlier one (a whole "train" section, say) would vanish without a word.
class RepeatedKeys {
 public:
  bool operator()(int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        // A container's name: its key in an object, or its array's name (no index).
        open_.push_back({open_.empty()        ? ""
                         : open_.back().array ? open_.back().name
                                              : child_name(pending_),
                         event == json::parse_event_t::array_start,
                         {}});
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        open_.pop_back();
        break;
      case json::parse_event_t::key:
        pending_ = parsed.get<std::string>();
        if (!open_.back().keys.insert(pending_).second && first_.empty())
          first_ = child_name(pending_);
        break;
      default:
        break;
    }
    return true;
  }
  const std::string& first() const { return first_; }  // "train" or "model.d_model"

 private:
  std::string child_name(const std::string& key) const {
    return open_.empty() || open_.back().name.empty() ? key : open_.back().name + "." + key;
  }
  struct Container {
    std::string name;
    bool array = false;
    std::set<std::string> keys;  // an object's keys so far
  };
  std::vector<Container> open_;
  std::string pending_, first_;
};

}  // namespace

json parse_json_noting_repeats(const std::string& text, std::string& repeated) {
  RepeatedKeys keys;
  json doc = json::parse(text, std::ref(keys));
  repeated = keys.first();
  return doc;
}

json load_json_file(const std::string& path) {
  std::string text = read_text_file(path);
  try {
    std::string repeated;
    json doc = parse_json_noting_repeats(text, repeated);
    if (!repeated.empty())
      fail(fmt::format("{}: '{}' appears twice in one object", path, repeated),
           "JSON keeps only the last of them: merge the two into one");
    return doc;
  } catch (const json::parse_error& e) {
    // Translate the byte offset into line:column for the user.
    size_t line = 1, col = 1;
    for (size_t i = 0; i < e.byte && i < text.size(); ++i) {
      if (text[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    fail(fmt::format("{}:{}:{}: invalid JSON: {}", path, line, col, e.what()),
         "fix the JSON syntax (missing comma or quote?)");
  } catch (const json::exception& e) {  // a number beyond a double's range
    fail(fmt::format("{}: invalid JSON: {}", path, e.what()),
         "numbers must fit a double (at most about 1.8e308): fix the value it names");
  }
}

namespace {

std::string known_keys(const json& obj) {
  std::string known;
  for (auto it = obj.begin(); it != obj.end(); ++it)
    known += (known.empty() ? "" : ", ") + it.key();
  return known.empty() ? "none" : known;
}

}  // namespace

void apply_override(json& root, const std::string& assignment, bool allow_new) {
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    fail(fmt::format("bad override '{}': expected key=value", assignment),
         "write e.g. --set train.lr=3e-4");
  std::string key = assignment.substr(0, eq);
  std::string value_text = assignment.substr(eq + 1);
  json value;
  try {
    value = json::parse(value_text);
  } catch (const json::parse_error&) {
    value = value_text;
  } catch (const json::exception&) {  // a number beyond a double's range
    fail(
        fmt::format("bad override '{}': {} is not a number a double holds", assignment, value_text),
        "numbers must be at most about 1.8e308 in magnitude");
  }
  json* node = &root;
  size_t start = 0;
  while (true) {
    size_t dot = key.find('.', start);
    std::string part =
        key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!node->is_object())
      fail(fmt::format("bad override '{}': '{}' is not an object", assignment,
                       key.substr(0, start ? start - 1 : 0)),
           "override the key itself, e.g. --set train.lr=3e-4");
    bool last = dot == std::string::npos;
    // A missing leaf is allowed (it may be a default the file omits; the strict reader
    // rejects unknown keys later), and so is a missing top-level section (a file may leave out
    // a whole section of defaults; the reader rejects an unknown one); a missing object deeper
    // down is a typo unless allow_new.
    if (!node->contains(part) && !allow_new && !last && node != &root)
      fail(fmt::format("bad override '{}': unknown key '{}'", assignment, key),
           fmt::format("known keys here: {}", known_keys(*node)));
    if (!last && !node->contains(part)) (*node)[part] = json::object();
    node = &(*node)[part];
    if (last) break;
    start = dot + 1;
  }
  // A whole section replaced would reset every key it does not name to its default.
  if (node->is_object() && value.is_object())
    fail(fmt::format("bad override '{}': it would replace the whole '{}' section, resetting the "
                     "keys it does not name",
                     assignment, key),
         fmt::format("set its keys one by one, e.g. --set {}.KEY=VALUE", key));
  *node = value;
}

}  // namespace foundry
