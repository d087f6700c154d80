// Reading raw text corpora: finding the input files and splitting them into documents.
//
// Formats (see docs/formats.md, "Inputs"):
//   text        one document per non-blank line (a trailing '\r' is dropped)
//   jsonl       one JSON object per non-blank line; the document is its string field
//               (default "text")
//   json-array  a JSON array of strings, one document each (the layout of nlp-corpus)
// Auto-detection: .txt/.text are text, .jsonl/.ndjson are jsonl, .json is json-array when it
// starts with '[' and jsonl when it starts with '{'. Any other name is sniffed the same way
// ('[' json-array, '{' jsonl) and read as text otherwise. Empty documents are skipped.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace foundry::data {

// Whether `text` holds only whitespace: ASCII's and Unicode's other White_Space characters
// (no-break, ideographic and the typographic spaces, the line and paragraph separators), read
// as UTF-8. Such a document, line or training sentence is skipped as blank.
bool is_blank_text(std::string_view text);

enum class InputFormat { Auto, Text, Jsonl, JsonArray };

// "auto" | "text" | "jsonl" | "json-array"; anything else is an Error listing the choices.
InputFormat parse_input_format(const std::string& name);
const char* input_format_name(InputFormat format);

struct InputFile {
  std::string path;
  InputFormat format = InputFormat::Auto;  // never Auto after resolve_inputs()
  uint64_t bytes = 0;
};

// Expands the --input paths into the files to read, in order. A file is taken as given; a
// directory is scanned recursively for .txt .text .jsonl .ndjson .json files (entries whose
// names start with '.' are skipped), sorted by path so the order never depends on the file
// system. `skip_dir` (if non-empty) is left out of scans, so a dataset written inside an
// input folder is not read back. `format` other than Auto applies to every file.
// A missing or unreadable path, or a folder with no supported files, is an Error.
std::vector<InputFile> resolve_inputs(const std::vector<std::string>& paths, InputFormat format,
                                      const std::string& skip_dir = "");

// The format of one file by its name and first non-blank byte (see the top of this file).
InputFormat detect_input_format(const std::string& path);

// What a scan of a file's bytes found that is not UTF-8 text. Invalid UTF-8 becomes U+FFFD
// (the replacement character) in the tokenizer; control bytes (NUL and the C0 controls other
// than tab, line feed, vertical tab, form feed, carriage return and escape) do not occur in
// text of any encoding.
struct TextCheck {
  uint64_t bytes = 0;
  uint64_t invalid_utf8_bytes = 0;
  uint64_t invalid_utf8_lines = 0;  // lines holding at least one
  uint64_t first_invalid_line = 0;  // 1-based; 0 when none
  uint64_t control_bytes = 0;
  uint64_t first_control_line = 0;
  // Binary rather than text: a NUL, or control bytes above one in a thousand.
  bool binary() const { return control_bytes > 0 && (has_nul || control_bytes * 1000 > bytes); }
  bool has_nul = false;
};
TextCheck check_text(const std::string& path);

// Calls on_document(text, end_offset) for every non-empty document of `file`, in order;
// end_offset is the byte offset in the file just past the document (for progress).
// Malformed input is an Error naming the file and line.
using DocumentCallback = std::function<void(std::string_view text, uint64_t end_offset)>;
void read_documents(const InputFile& file, const std::string& jsonl_field,
                    const DocumentCallback& on_document);

}  // namespace foundry::data
