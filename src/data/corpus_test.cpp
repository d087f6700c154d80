#include "data/corpus.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "data/test_util.h"

namespace foundry::data {
namespace {

using testing::expect_error;
using testing::TempDir;
using testing::write_file;

std::vector<std::string> documents_of(const std::string& path, InputFormat format,
                                      const std::string& field = "text") {
  std::vector<std::string> docs;
  read_documents({path, format, 0}, field,
                 [&](std::string_view text, uint64_t) { docs.emplace_back(text); });
  return docs;
}

using Docs = std::vector<std::string>;

TEST(Corpus, TextIsOneDocumentPerNonBlankLine) {
  TempDir dir;
  write_file(dir.file("a.txt"), "\xEF\xBB\xBF" "first doc\r\n\n   \n  second, indented\nthird");
  EXPECT_EQ(documents_of(dir.file("a.txt"), InputFormat::Text),
            (Docs{"first doc", "  second, indented", "third"}));
  write_file(dir.file("empty.txt"), "");
  EXPECT_TRUE(documents_of(dir.file("empty.txt"), InputFormat::Text).empty());
}

TEST(Corpus, EndOffsetsReachTheFileSize) {
  TempDir dir;
  const std::string text = "one\ntwo\nthree\n";
  write_file(dir.file("a.txt"), text);
  std::vector<uint64_t> ends;
  read_documents({dir.file("a.txt"), InputFormat::Text, 0}, "text",
                 [&](std::string_view, uint64_t end) { ends.push_back(end); });
  EXPECT_EQ(ends, (std::vector<uint64_t>{4, 8, 14}));
}

TEST(Corpus, JsonlReadsTheNamedField) {
  TempDir dir;
  write_file(
      dir.file("a.jsonl"),
      "{\"text\": \"hello\\nworld\", \"id\": 1}\n\n{\"text\": \"\"}\n{\"text\": \" \\t\\n \"}\n"
      "{\"body\": \"x\", \"text\": \"é\"}\n");
  EXPECT_EQ(documents_of(dir.file("a.jsonl"), InputFormat::Jsonl), (Docs{"hello\nworld", "é"}));
  write_file(dir.file("b.jsonl"), "{\"body\": \"one\"}\r\n{\"body\": \"two\"}");
  EXPECT_EQ(documents_of(dir.file("b.jsonl"), InputFormat::Jsonl, "body"), (Docs{"one", "two"}));
}

// Bytes that are not UTF-8 (Latin-1 text) in a JSON string become U+FFFD, as in plain text,
// instead of failing the JSON parser; with or without escapes in the string.
TEST(Corpus, JsonStringsWithLatin1BytesReadWithReplacementCharacters) {
  TempDir dir;
  write_file(dir.file("a.jsonl"), "{\"text\": \"Caf\xe9\"}\n");
  EXPECT_EQ(documents_of(dir.file("a.jsonl"), InputFormat::Jsonl), (Docs{"Caf\uFFFD"}));
  write_file(dir.file("a.json"), "[\"Caf\xe9 says \\\"hi\\\"\"]");
  EXPECT_EQ(documents_of(dir.file("a.json"), InputFormat::JsonArray),
            (Docs{"Caf\uFFFD says \"hi\""}));
}

TEST(Corpus, JsonlErrorsNameFileAndLine) {
  TempDir dir;
  const std::string path = dir.file("bad.jsonl");
  write_file(path, "{\"text\": \"ok\"}\n{\"text\": \"broken}\n");
  expect_error([&] { documents_of(path, InputFormat::Jsonl); }, {path + ":2:", "malformed JSON"});

  write_file(path, "{\"text\": \"ok\"}\n\n{\"body\": \"x\", \"id\": 3}\n");
  const Error missing = expect_error([&] { documents_of(path, InputFormat::Jsonl); },
                                     {path + ":3:", "no field \"text\"", "body, id"});
  EXPECT_TRUE(testing::contains(missing.hint(), "--jsonl-field"));

  write_file(path, "{\"text\": 42}\n");
  expect_error([&] { documents_of(path, InputFormat::Jsonl); },
               {path + ":1:", "a number, not a string"});

  write_file(path, "[\"an array\"]\n");
  expect_error([&] { documents_of(path, InputFormat::Jsonl); },
               {path + ":1:", "expected a JSON object"});
}

TEST(Corpus, JsonArrayReadsStrings) {
  TempDir dir;
  write_file(dir.file("a.json"),
             "\xEF\xBB\xBF [\n  \"plain\",\n  \"esc \\\"q\\\" \\n \\u00e9 \\ud83d\\ude00\",\n  "
             "\"\",\n  \"   \",\n  \"\\t \\n\",\n  \"last\"\n]\n");
  EXPECT_EQ(documents_of(dir.file("a.json"), InputFormat::JsonArray),
            (Docs{"plain", "esc \"q\" \n é 😀", "last"}));
  write_file(dir.file("empty.json"), " [ ] ");
  EXPECT_TRUE(documents_of(dir.file("empty.json"), InputFormat::JsonArray).empty());
  // An empty file (or one of blanks after a byte-order mark) holds no documents, as a .txt.
  for (const char* nothing : {"", "\xEF\xBB\xBF \n\n"}) {
    write_file(dir.file("nothing.json"), nothing);
    EXPECT_TRUE(documents_of(dir.file("nothing.json"), InputFormat::JsonArray).empty());
  }
}

// Unicode's whitespace is blank as ASCII's is: a document of no-break or ideographic spaces is
// skipped; a letter among them, or a byte that is not UTF-8, makes it text.
TEST(Corpus, BlankMeansUnicodeWhitespaceToo) {
  for (const char* blank :
       {"", " \t\r\f\v", "\xC2\xA0", "\xE3\x80\x80", "\xE2\x80\x83 \xE2\x80\xAF",
        "\xE2\x80\xA8\xE2\x80\xA9", "\xE2\x81\x9F\xE1\x9A\x80\xC2\x85"})
    EXPECT_TRUE(is_blank_text(blank)) << blank;
  for (const char* text :
       {"a", "\xC2\xA0x", "\xE2\x80\x8B", "\xE2\x80", "\xC2", "\xFF", "\xE3\x80\x81"})
    EXPECT_FALSE(is_blank_text(text)) << text;
  TempDir dir;
  write_file(dir.file("a.txt"), "real text\n\xC2\xA0\n\xE3\x80\x80 \n");
  EXPECT_EQ(documents_of(dir.file("a.txt"), InputFormat::Text), (Docs{"real text"}));
  write_file(dir.file("a.json"), "[\"\\u2003\", \"x\"]");
  EXPECT_EQ(documents_of(dir.file("a.json"), InputFormat::JsonArray), (Docs{"x"}));
}

TEST(Corpus, JsonArrayErrorsNameFileAndLine) {
  TempDir dir;
  const std::string path = dir.file("bad.json");
  auto expect_bad = [&](const std::string& content, std::initializer_list<std::string> what) {
    write_file(path, content);
    expect_error([&] { documents_of(path, InputFormat::JsonArray); }, what);
  };
  expect_bad("[\n\"a\",\n\"b\"\n\"c\"\n]",
             {path + ":4:", "expected ',' or ']' after array element 1"});
  expect_bad("[\n\"a\",\n 17\n]", {path + ":3:", "array element 1 is not a string"});
  expect_bad("[\n\"a\",\n{\"text\": \"x\"}]", {path + ":3:", "not a string"});
  expect_bad("[\n\"a\",\n\"unterminated\n]", {path + ":3:", "unterminated string"});
  expect_bad("[\n\"a\",\n\"b\"\n", {path + ":4:", "not closed"});
  expect_bad("[\"a\"] trailing", {path + ":1:", "after the closing"});
  expect_bad("{\"not\": \"an array\"}", {path + ":1:", "expected a JSON array"});
  expect_bad("[\n\"bad escape \\q\"]", {path + ":2:", "invalid string"});
}

TEST(Corpus, DetectsFormatByExtensionThenContent) {
  TempDir dir;
  write_file(dir.file("a.txt"), "[looks like json]");
  write_file(dir.file("a.TEXT"), "x");
  write_file(dir.file("a.jsonl"), "{}");
  write_file(dir.file("a.ndjson"), "{}");
  write_file(dir.file("arr.json"), "  [\"x\"]");
  write_file(dir.file("lines.json"), "{\"text\": \"x\"}\n");
  write_file(dir.file("noext_arr"), "\n[\"x\"]");
  write_file(dir.file("noext_lines"), "{\"text\": \"x\"}");
  write_file(dir.file("noext_text"), "just words");
  EXPECT_EQ(detect_input_format(dir.file("a.txt")), InputFormat::Text);
  EXPECT_EQ(detect_input_format(dir.file("a.TEXT")), InputFormat::Text);
  EXPECT_EQ(detect_input_format(dir.file("a.jsonl")), InputFormat::Jsonl);
  EXPECT_EQ(detect_input_format(dir.file("a.ndjson")), InputFormat::Jsonl);
  EXPECT_EQ(detect_input_format(dir.file("arr.json")), InputFormat::JsonArray);
  EXPECT_EQ(detect_input_format(dir.file("lines.json")), InputFormat::Jsonl);
  EXPECT_EQ(detect_input_format(dir.file("noext_arr")), InputFormat::JsonArray);
  EXPECT_EQ(detect_input_format(dir.file("noext_lines")), InputFormat::Jsonl);
  EXPECT_EQ(detect_input_format(dir.file("noext_text")), InputFormat::Text);
}

TEST(Corpus, ParsesFormatNames) {
  EXPECT_EQ(parse_input_format("json-array"), InputFormat::JsonArray);
  EXPECT_STREQ(input_format_name(InputFormat::Jsonl), "jsonl");
  const Error e = expect_error([] { parse_input_format("csv"); }, {"csv"});
  EXPECT_TRUE(testing::contains(e.hint(), "json-array"));
}

TEST(Corpus, ScansFoldersRecursivelyInNameOrder) {
  TempDir dir;
  // The layout of the nlp-corpus package: builds/doc-N.json arrays of sentences.
  const std::string root = dir.file("corpus");
  write_file(root + "/builds/doc-10.json", "[\"ten\"]");
  write_file(root + "/builds/doc-2.json", "[\"two\"]");
  write_file(root + "/builds/doc-1.json", "[\"one\"]");
  write_file(root + "/extra.txt", "text");
  write_file(root + "/notes.md", "ignored: not a supported extension");
  write_file(root + "/.hidden.txt", "ignored: hidden");
  write_file(root + "/.git/config.txt", "ignored: hidden folder");
  write_file(root + "/out/meta.json", "{}");  // the dataset being written: skipped
  // Another prepared dataset in the corpus folder: skipped, with a note.
  write_file(root + "/older/meta.json", "{}");
  write_file(root + "/older/tokenizer.model", "model");
  ::testing::internal::CaptureStderr();
  const auto files = resolve_inputs({root}, InputFormat::Auto, root + "/out");
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("skipping '" + root + "/older', a prepared dataset"), std::string::npos)
      << log;
  std::vector<std::string> names;
  for (const auto& f : files) names.push_back(f.path.substr(root.size() + 1));
  EXPECT_EQ(names, (std::vector<std::string>{"builds/doc-1.json", "builds/doc-10.json",
                                             "builds/doc-2.json", "extra.txt"}));
  EXPECT_EQ(files[0].format, InputFormat::JsonArray);
  EXPECT_EQ(files[0].bytes, 7u);
  EXPECT_EQ(files[3].format, InputFormat::Text);

  // A forced format applies to every file; explicit files keep the order given.
  const auto forced = resolve_inputs({root + "/extra.txt", root + "/builds/doc-2.json"},
                                     InputFormat::Text);
  ASSERT_EQ(forced.size(), 2u);
  EXPECT_EQ(forced[1].format, InputFormat::Text);
  EXPECT_EQ(forced[1].path, root + "/builds/doc-2.json");
}

// A symbolic link to a folder inside a scanned folder is not followed, and the scan says so;
// a link to a file is read, and a data file's name that links to nothing is said.
TEST(Corpus, AScanSaysItSkipsLinksToFolders) {
  TempDir dir;
  write_file(dir.file("elsewhere/a.txt"), "linked text");
  write_file(dir.file("scan/x.txt"), "own text");
  std::filesystem::create_directory_symlink(dir.file("elsewhere"), dir.file("scan/link"));
  std::filesystem::create_symlink(dir.file("elsewhere/a.txt"), dir.file("scan/file.txt"));
  std::filesystem::create_symlink(dir.file("elsewhere/gone.txt"), dir.file("scan/broken.txt"));
  ::testing::internal::CaptureStderr();
  const auto files = resolve_inputs({dir.file("scan")}, InputFormat::Auto);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0].path, dir.file("scan/file.txt"));
  EXPECT_EQ(files[1].path, dir.file("scan/x.txt"));
  EXPECT_NE(log.find("skipping '" + dir.file("scan/link") + "', a symbolic link to a folder"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("skipping '" + dir.file("scan/broken.txt") + "': a symbolic link to nothing"),
            std::string::npos)
      << log;
}

TEST(Corpus, BadInputPathsAreErrors) {
  TempDir dir;
  expect_error([&] { resolve_inputs({dir.file("missing.txt")}, InputFormat::Auto); },
               {dir.file("missing.txt"), "does not exist"});
  std::filesystem::create_directories(dir.file("empty"));
  write_file(dir.file("empty/readme.md"), "x");
  expect_error([&] { resolve_inputs({dir.file("empty")}, InputFormat::Auto); },
               {dir.file("empty"), "holds no .txt"});
  expect_error([&] { resolve_inputs({}, InputFormat::Auto); }, {"no input"});
  // One file under two names, a hard link too: its documents would be read twice.
  write_file(dir.file("twice/a.txt"), "text");
  std::filesystem::create_hard_link(dir.file("twice/a.txt"), dir.file("twice/b.txt"));
  expect_error([&] { resolve_inputs({dir.file("twice")}, InputFormat::Auto); },
               {"input '" + dir.file("twice/b.txt") + "' is the file '" + dir.file("twice/a.txt") +
                "' already read"});
  if (::geteuid() != 0) {  // root reads everything
    write_file(dir.file("locked.txt"), "x");
    std::filesystem::permissions(dir.file("locked.txt"), std::filesystem::perms::none);
    expect_error([&] { resolve_inputs({dir.file("locked.txt")}, InputFormat::Auto); },
                 {dir.file("locked.txt"), "cannot read"});
  }
}

}  // namespace
}  // namespace foundry::data
