#include "data/corpus.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/io.h"
#include "data/dataset.h"

namespace foundry::data {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const std::vector<std::string> kScannedExtensions = {".txt", ".text", ".jsonl", ".ndjson", ".json"};

std::string lowercase_extension(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext;
}

bool is_blank(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v';
}

// Bytes to skip at the start of a file: a UTF-8 byte-order mark.
size_t bom_length(const uint8_t* data, size_t size) {
  return size >= 3 && data[0] == 0xEF && data[1] == 0xBB && data[2] == 0xBF ? 3 : 0;
}

size_t line_number_at(const char* data, size_t offset) {
  return 1 + static_cast<size_t>(std::count(data, data + offset, '\n'));
}

// nlohmann messages start with "[json.exception.parse_error.101] "; the rest is the useful part.
std::string short_json_error(const std::exception& e) {
  std::string what = e.what();
  auto close = what.find("] ");
  return close == std::string::npos ? what : what.substr(close + 2);
}

const char* json_type_name(const json& value) {
  return value.is_object() ? "an object" : value.is_array() ? "an array"
       : value.is_string() ? "a string" : value.is_number() ? "a number"
       : value.is_boolean() ? "a boolean" : "null";
}

// Calls on_line(line, end_offset) for each line of the buffer without its '\n' and '\r'.
template <typename OnLine>
void for_each_line(const char* data, size_t size, size_t start, OnLine&& on_line) {
  size_t line_start = start;
  size_t line_number = 1;
  while (line_start < size) {
    const void* newline = std::memchr(data + line_start, '\n', size - line_start);
    size_t line_end =
        newline ? static_cast<size_t>(static_cast<const char*>(newline) - data) : size;
    size_t content_end = line_end;
    if (content_end > line_start && data[content_end - 1] == '\r') --content_end;
    const size_t next = newline ? line_end + 1 : size;
    on_line(std::string_view(data + line_start, content_end - line_start), line_number, next);
    line_start = next;
    ++line_number;
  }
}

// The length of the valid UTF-8 sequence at data[i] (1 to 4), or 0 when it is invalid.
size_t utf8_sequence_length(const uint8_t* data, size_t size, size_t i) {
  const uint8_t b = data[i];
  if (b < 0x80) return 1;
  size_t n = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (b >= 0xC2 && b <= 0xDF) n = 2;
  else if (b == 0xE0) n = 3, lo = 0xA0;
  else if (b >= 0xE1 && b <= 0xEC) n = 3;
  else if (b == 0xED) n = 3, hi = 0x9F;  // no surrogates
  else if (b >= 0xEE && b <= 0xEF) n = 3;
  else if (b == 0xF0) n = 4, lo = 0x90;
  else if (b >= 0xF1 && b <= 0xF3) n = 4;
  else if (b == 0xF4) n = 4, hi = 0x8F;  // up to U+10FFFF
  else return 0;
  if (i + n > size || data[i + 1] < lo || data[i + 1] > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (data[i + k] < 0x80 || data[i + k] > 0xBF) return 0;
  return n;
}

// `text`, or (in `storage`) `text` with every byte that begins no valid UTF-8 sequence
// replaced by U+FFFD, as the tokenizer reads such a byte in plain text: the JSON parser
// refuses them. Valid text, nearly all of it, is not copied.
std::string_view with_valid_utf8(std::string_view text, std::string& storage) {
  const auto* data = reinterpret_cast<const uint8_t*>(text.data());
  size_t i = 0, n = 0;
  while (i < text.size() && (n = utf8_sequence_length(data, text.size(), i)) > 0) i += n;
  if (i == text.size()) return text;
  storage.assign(text.substr(0, i));
  while (i < text.size()) {
    n = utf8_sequence_length(data, text.size(), i);
    if (n == 0) {
      storage += "\xEF\xBF\xBD";
      ++i;
    } else {
      storage.append(text.data() + i, n);
      i += n;
    }
  }
  return storage;
}

}  // namespace

bool is_blank_text(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    if (p[i] < 0x80) {
      if (!is_blank(static_cast<char>(p[i]))) return false;
      ++i;
      continue;
    }
    // Unicode's other White_Space characters, as UTF-8: U+0085 and U+00A0 (C2 85, C2 A0),
    // U+1680 (E1 9A 80), U+2000–U+200A, U+2028, U+2029, U+202F (E2 80 xx), U+205F (E2 81 9F)
    // and U+3000 (E3 80 80). Anything else, invalid UTF-8 included, is text.
    if (i + 1 < n && p[i] == 0xC2 && (p[i + 1] == 0x85 || p[i + 1] == 0xA0)) {
      i += 2;
      continue;
    }
    if (i + 2 >= n) return false;
    const unsigned b1 = p[i + 1], b2 = p[i + 2];
    const bool space = (p[i] == 0xE1 && b1 == 0x9A && b2 == 0x80) ||
                       (p[i] == 0xE2 && b1 == 0x80 &&
                        (b2 <= 0x8A || b2 == 0xA8 || b2 == 0xA9 || b2 == 0xAF) && b2 >= 0x80) ||
                       (p[i] == 0xE2 && b1 == 0x81 && b2 == 0x9F) ||
                       (p[i] == 0xE3 && b1 == 0x80 && b2 == 0x80);
    if (!space) return false;
    i += 3;
  }
  return true;
}

namespace {

void read_text(const InputFile& file, const char* data, size_t size, size_t start,
               const DocumentCallback& on_document) {
  for_each_line(data, size, start, [&](std::string_view line, size_t, size_t end) {
    if (!is_blank_text(line)) on_document(line, end);
  });
}

void read_jsonl(const InputFile& file, const char* data, size_t size, size_t start,
                const std::string& field, const DocumentCallback& on_document) {
  for_each_line(data, size, start, [&](std::string_view line, size_t line_number, size_t end) {
    if (is_blank_text(line)) return;
    json record;
    try {
      std::string storage;
      record = json::parse(with_valid_utf8(line, storage));
    } catch (const json::parse_error& e) {
      fail(fmt::format("{}:{}: malformed JSON: {}", file.path, line_number, short_json_error(e)),
           lowercase_extension(file.path) == ".json"
               ? "a .json input must be an array of strings or hold one JSON object per line; "
                 "if a folder scan picked up a file that is not data (such as package.json), "
                 "pass the data files or their own folder as --input"
               : "each line of a JSONL file must be one complete JSON object; pass --format "
                 "text if the file is plain text");
    } catch (const json::exception& e) {  // a number beyond a double's range
      fail(fmt::format("{}:{}: malformed JSON: {}", file.path, line_number, short_json_error(e)),
           "numbers must fit a double (at most about 1.8e308): fix or remove the value");
    }
    if (!record.is_object())
      fail(fmt::format("{}:{}: expected a JSON object, got {}", file.path, line_number,
                       json_type_name(record)),
           "each line of a JSONL file must be an object holding the text in a string field");
    auto it = record.find(field);
    if (it == record.end()) {
      std::string keys;
      for (auto k = record.begin(); k != record.end(); ++k)
        keys += (keys.empty() ? "" : ", ") + k.key();
      fail(fmt::format("{}:{}: the object has no field \"{}\" (its fields: {})", file.path,
                       line_number, field, keys.empty() ? "none" : keys),
           "name the field that holds the text with --jsonl-field");
    }
    if (!it->is_string())
      fail(fmt::format("{}:{}: field \"{}\" is {}, not a string", file.path, line_number, field,
                       json_type_name(*it)),
           "the --jsonl-field must hold the document text as a JSON string");
    const std::string& text = it->get_ref<const std::string&>();
    if (!is_blank_text(text)) on_document(text, end);  // as a blank line of text
  });
}

// A streaming reader for a JSON array of strings. It needs no DOM, so its memory does not
// grow with the file, and every error carries an exact line number.
class JsonArrayReader {
 public:
  JsonArrayReader(const InputFile& file, const char* data, size_t size, size_t start)
      : file_(file), data_(data), size_(size), pos_(start) {}

  void read(const DocumentCallback& on_document) {
    skip_blanks();
    if (pos_ >= size_) return;  // an empty file holds no documents, as an empty .txt
    if (data_[pos_] != '[') error(pos_, "expected a JSON array of strings ('[')");
    ++pos_;
    skip_blanks();
    if (pos_ < size_ && data_[pos_] == ']') {
      ++pos_;
    } else {
      for (size_t index = 0;; ++index) {
        skip_blanks();
        read_string(index, on_document);
        skip_blanks();
        if (pos_ < size_ && data_[pos_] == ',') {
          ++pos_;
          continue;
        }
        if (pos_ < size_ && data_[pos_] == ']') {
          ++pos_;
          break;
        }
        error(pos_, pos_ >= size_
                        ? "the array is not closed (missing ']')"
                        : fmt::format("expected ',' or ']' after array element {}", index));
      }
    }
    skip_blanks();
    if (pos_ < size_) error(pos_, "unexpected content after the closing ']'");
  }

 private:
  void skip_blanks() {
    while (pos_ < size_ && is_blank(data_[pos_])) ++pos_;
  }

  void read_string(size_t index, const DocumentCallback& on_document) {
    if (pos_ >= size_) error(pos_, "the array is not closed (missing ']')");
    if (data_[pos_] != '"')
      error(pos_, fmt::format("array element {} is not a string (it starts with '{}')", index,
                              data_[pos_]));
    const size_t open = pos_;
    bool has_escape = false;
    size_t i = open + 1;
    while (i < size_ && data_[i] != '"') {
      if (data_[i] == '\n')
        error(open, fmt::format("array element {}: unterminated string", index));
      if (data_[i] == '\\') {
        has_escape = true;
        ++i;
      }
      ++i;
    }
    if (i >= size_) error(open, fmt::format("array element {}: unterminated string", index));
    pos_ = i + 1;
    if (!has_escape) {
      const std::string_view text(data_ + open + 1, i - open - 1);
      if (!is_blank_text(text)) on_document(text, pos_);
      return;
    }
    std::string text;
    try {
      std::string storage;
      text = json::parse(with_valid_utf8(std::string_view(data_ + open, pos_ - open), storage))
                 .get<std::string>();
    } catch (const json::exception& e) {
      error(open, fmt::format("array element {}: invalid string: {}", index, short_json_error(e)));
    }
    if (!is_blank_text(text)) on_document(text, pos_);
  }

  [[noreturn]] void error(size_t at, const std::string& problem) const {
    fail(fmt::format("{}:{}: malformed JSON: {}", file_.path, line_number_at(data_, at), problem),
         "a .json input must be an array of strings, e.g. [\"first document\", \"second\"]; "
         "pass --format to override the detected format");
  }

  const InputFile& file_;
  const char* data_;
  size_t size_;
  size_t pos_;
};

void check_readable(const std::string& path) {
  if (::access(path.c_str(), R_OK) != 0)
    fail(fmt::format("cannot read input '{}': {}", path, std::strerror(errno)),
         "check the file's permissions");
}

}  // namespace

InputFormat parse_input_format(const std::string& name) {
  if (name == "auto") return InputFormat::Auto;
  if (name == "text") return InputFormat::Text;
  if (name == "jsonl") return InputFormat::Jsonl;
  if (name == "json-array") return InputFormat::JsonArray;
  fail(fmt::format("unknown input format '{}'", name), "use one of: auto, text, jsonl, json-array");
}

const char* input_format_name(InputFormat format) {
  switch (format) {
    case InputFormat::Auto: return "auto";
    case InputFormat::Text: return "text";
    case InputFormat::Jsonl: return "jsonl";
    case InputFormat::JsonArray: return "json-array";
  }
  return "?";
}

InputFormat detect_input_format(const std::string& path) {
  const std::string ext = lowercase_extension(path);
  if (ext == ".txt" || ext == ".text") return InputFormat::Text;
  if (ext == ".jsonl" || ext == ".ndjson") return InputFormat::Jsonl;
  // Sniff the first non-blank byte (only the start of the file is paged in).
  MappedFile file(path);
  const char* data = reinterpret_cast<const char*>(file.data());
  size_t i = bom_length(file.data(), file.size());
  while (i < file.size() && is_blank(data[i])) ++i;
  const char first = i < file.size() ? data[i] : '\0';
  if (ext == ".json") return first == '{' ? InputFormat::Jsonl : InputFormat::JsonArray;
  if (first == '[') return InputFormat::JsonArray;
  if (first == '{') return InputFormat::Jsonl;
  return InputFormat::Text;
}

std::vector<InputFile> resolve_inputs(const std::vector<std::string>& paths, InputFormat format,
                                      const std::string& skip_dir) {
  if (paths.empty()) fail("no input given", "pass --input PATH (a file or a folder), repeatable");
  std::error_code ec;
  const fs::path skip = skip_dir.empty() ? fs::path() : fs::weakly_canonical(skip_dir, ec);
  std::vector<InputFile> files;
  // (device, inode) -> the path that added it: the same file under any name, hard links too.
  std::map<std::pair<uint64_t, uint64_t>, std::string> added;
  auto add = [&](const std::string& path) {
    check_readable(path);
    // The same file twice (given twice, or inside a folder also given) would put its
    // documents in the data twice, and some in both splits.
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
      fail(fmt::format("cannot read input '{}': {}", path, std::strerror(errno)));
    const std::pair<uint64_t, uint64_t> id{static_cast<uint64_t>(st.st_dev),
                                           static_cast<uint64_t>(st.st_ino)};
    if (auto [at, fresh] = added.emplace(id, path); !fresh)
      fail(fmt::format("input '{}' is the file '{}' already read", path, at->second),
           "give each file once (a folder's files are read with it)");
    InputFile f;
    f.path = path;
    f.bytes = fs::file_size(path, ec);
    if (ec) fail(fmt::format("cannot read input '{}': {}", path, ec.message()));
    f.format = format == InputFormat::Auto ? detect_input_format(path) : format;
    files.push_back(std::move(f));
  };

  for (const std::string& path : paths) {
    const auto status = fs::status(path, ec);
    if (ec || !fs::exists(status))
      fail(fmt::format("input '{}' does not exist", path), "check the --input path");
    if (fs::is_regular_file(status)) {
      add(path);
      continue;
    }
    if (!fs::is_directory(status))
      fail(fmt::format("input '{}' is neither a file nor a folder", path),
           "pass text, JSONL or JSON files, or folders holding them");
    check_readable(path);
    std::vector<std::string> found;
    fs::recursive_directory_iterator it(path, ec), end;
    if (ec) fail(fmt::format("cannot read input folder '{}': {}", path, ec.message()));
    for (; it != end; it.increment(ec)) {
      if (ec) fail(fmt::format("cannot scan input folder '{}': {}", path, ec.message()));
      const fs::path& entry = it->path();
      const bool hidden = entry.filename().string().starts_with(".");
      if (it->is_directory()) {
        // A link to a folder is not followed (a link back up would loop): said, not silent.
        if (!hidden && it->is_symlink())
          fmt::print(stderr,
                     "warning: skipping '{}', a symbolic link to a folder (a scan does not follow "
                     "them): pass it as an --input of its own to read it\n",
                     entry.string());
        if (hidden || (!skip.empty() && fs::weakly_canonical(entry, ec) == skip)) {
          it.disable_recursion_pending();
        } else if (fs::exists(entry / kMetaFileName, ec) &&
                   fs::exists(entry / kTokenizerFileName, ec)) {
          // A prepared dataset: its meta.json is no document.
          fmt::print(stderr,
                     "note: skipping '{}', a prepared dataset (meta.json, tokenizer.model)\n",
                     entry.string());
          it.disable_recursion_pending();
        }
        continue;
      }
      const std::string ext = lowercase_extension(entry.string());
      const bool data_name = std::find(kScannedExtensions.begin(), kScannedExtensions.end(), ext) !=
                             kScannedExtensions.end();
      // A data file's name that is no file to read (a broken link, a pipe): said, not silent.
      if (!hidden && data_name && !it->is_regular_file()) {
        fmt::print(stderr, "warning: skipping '{}': {}\n", entry.string(),
                   it->is_symlink() ? "a symbolic link to nothing" : "not a regular file");
        continue;
      }
      if (hidden || !it->is_regular_file()) continue;
      if (data_name) found.push_back(entry.string());
    }
    if (found.empty())
      fail(fmt::format("input folder '{}' holds no .txt, .text, .jsonl, .ndjson or .json files",
                       path),
           "point --input at the folder that holds the data files, or at the files themselves");
    std::sort(found.begin(), found.end());
    for (const std::string& f : found) add(f);
  }
  return files;
}

namespace {


bool is_control_byte(uint8_t b) {
  return b < 0x20 && b != '\t' && b != '\n' && b != '\v' && b != '\f' && b != '\r' && b != 0x1B;
}

}  // namespace

TextCheck check_text(const std::string& path) {
  MappedFile mapped(path);
  const uint8_t* data = mapped.data();
  const size_t size = mapped.size();
  TextCheck c;
  c.bytes = size;
  uint64_t line = 1, last_invalid_line = 0;
  for (size_t i = bom_length(data, size); i < size;) {
    const uint8_t b = data[i];
    if (b == '\n') ++line;
    if (is_control_byte(b)) {
      ++c.control_bytes;
      c.has_nul = c.has_nul || b == 0;
      if (c.first_control_line == 0) c.first_control_line = line;
    }
    const size_t n = utf8_sequence_length(data, size, i);
    if (n > 0) {
      i += n;
      continue;
    }
    ++c.invalid_utf8_bytes;
    if (c.first_invalid_line == 0) c.first_invalid_line = line;
    if (last_invalid_line != line) ++c.invalid_utf8_lines, last_invalid_line = line;
    ++i;
  }
  return c;
}

void read_documents(const InputFile& file, const std::string& jsonl_field,
                    const DocumentCallback& on_document) {
  MappedFile mapped(file.path);
  const char* data = reinterpret_cast<const char*>(mapped.data());
  const size_t size = mapped.size();
  const size_t start = bom_length(mapped.data(), size);
  switch (file.format) {
    case InputFormat::Text: read_text(file, data, size, start, on_document); break;
    case InputFormat::Jsonl: read_jsonl(file, data, size, start, jsonl_field, on_document); break;
    case InputFormat::JsonArray: JsonArrayReader(file, data, size, start).read(on_document); break;
    case InputFormat::Auto: FOUNDRY_CHECK(!"read_documents needs a resolved format");
  }
}

}  // namespace foundry::data
