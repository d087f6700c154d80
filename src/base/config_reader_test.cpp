#include "base/config_reader.h"

#include <gtest/gtest.h>

#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "base/io.h"
#include "base/test_expect_error.h"
#include "base/test_temp_dir.h"

namespace foundry {
namespace {

enum class Size { small, large };

std::optional<Size> parse_size(std::string_view name) {
  if (name == "small" || name == "s") return Size::small;
  if (name == "large") return Size::large;
  return std::nullopt;
}

TEST(ConfigReader, ParsedChoiceTakesAnySpellingTheParserKnows) {
  Size size = Size::large;
  ConfigReader(json{{"size", "s"}}, "run.json", "model.")
      .get_parsed("size", size, parse_size, "small, large");
  EXPECT_EQ(size, Size::small);
}

TEST(ConfigReader, WrongValuesCarryTheReadersHint) {
  const json doc{{"n", "three"}, {"m", 7}};
  int64_t n = 0, m = 0;
  try {
    ConfigReader(doc, "meta.json", "", "re-run prepare").get("n", n);
    ADD_FAILURE() << "no error for a string in an integer key";
  } catch (const Error& e) {
    EXPECT_EQ(e.hint(), "re-run prepare");
  }
  try {
    ConfigReader(doc, "run.json").get("m", m, int64_t{0}, int64_t{5});
    ADD_FAILURE() << "no error for a value out of range";
  } catch (const Error& e) {
    EXPECT_EQ(e.hint(), "fix the value in the config or with --set");
  }
}

TEST(ConfigReader, AbsentParsedChoiceKeepsTheDefault) {
  Size size = Size::large;
  const json empty = json::object();  // the reader keeps a reference: it must outlive it
  ConfigReader reader(empty, "run.json", "model.");
  reader.get_parsed("size", size, parse_size, "small, large");
  EXPECT_EQ(size, Size::large);
  reader.finish();
}

TEST(ConfigReader, UnknownParsedChoiceNamesTheKeyTheValueAndTheChoices) {
  Size size = Size::large;
  expect_error(
      [&] {
        ConfigReader(json{{"size", "huge"}}, "run.json", "model.")
            .get_parsed("size", size, parse_size, "small, large");
      },
      "run.json: 'model.size' = \"huge\" is not one of: small, large");
  expect_error(
      [&] {
        ConfigReader(json{{"size", 3}}, "run.json", "model.")
            .get_parsed("size", size, parse_size, "small, large");
      },
      "'model.size' must be a string, got 3");
}

// A key written twice in one object is refused, named by its path (through arrays by the
// array's name); the same key in different objects is fine.
TEST(LoadJsonFile, AKeyTwiceInOneObjectIsNamedByItsPath) {
  testing::TempDir dir;
  const std::string path = dir.file("c.json");
  write_file_atomic(path, R"({"a": {"x": 1}, "b": {"x": 2}, "c": [{"k": 1}, {"k": 2}]})");
  EXPECT_EQ(load_json_file(path)["c"][1]["k"], 2);
  for (const auto& [text, name] : std::vector<std::pair<std::string, std::string>>{
           {R"({"train": {"lr": 1}, "train": {}})", "'train'"},
           {R"({"model": {"d": 1, "d": 2}})", "'model.d'"},
           {R"({"data": {"x": [{"a": 1}, {"b": 1, "b": 2}]}})", "'data.x.b'"}}) {
    write_file_atomic(path, text);
    expect_error([&] { load_json_file(path); }, name + " appears twice in one object");
  }
}

}  // namespace
}  // namespace foundry
