#include "ckpt/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <set>

#include "base/config_reader.h"
#include "base/error.h"
#include "base/hash.h"

namespace foundry {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this writer copies memory as is");

namespace {

struct DtypeInfo {
  StDtype dtype;
  const char* name;
  size_t bytes;
};

constexpr DtypeInfo kDtypes[] = {
    {StDtype::BOOL, "BOOL", 1}, {StDtype::U8, "U8", 1},   {StDtype::I8, "I8", 1},
    {StDtype::F8_E5M2, "F8_E5M2", 1}, {StDtype::F8_E4M3, "F8_E4M3", 1},
    {StDtype::I16, "I16", 2},   {StDtype::U16, "U16", 2}, {StDtype::F16, "F16", 2},
    {StDtype::BF16, "BF16", 2}, {StDtype::I32, "I32", 4}, {StDtype::U32, "U32", 4},
    {StDtype::F32, "F32", 4},   {StDtype::F64, "F64", 8}, {StDtype::I64, "I64", 8},
    {StDtype::U64, "U64", 8},
};

const DtypeInfo& info_of(StDtype dtype) {
  for (const auto& d : kDtypes)
    if (d.dtype == dtype) return d;
  FOUNDRY_CHECK(false);
  return kDtypes[0];
}

// The reference implementation refuses headers above 100 MB; so do we, before parsing.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// Hashing and writing go chunk by chunk so each chunk is still in cache when write()
// copies it into the page cache: one pass over memory instead of two.
constexpr size_t kWriteChunkBytes = size_t{8} << 20;

// numel(shape) * element_bytes, or false on overflow.
bool byte_size(const std::vector<int64_t>& shape, size_t element_bytes, uint64_t* out) {
  uint64_t total = element_bytes;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(total, static_cast<uint64_t>(d), &total)) return false;
  }
  *out = total;
  return true;
}

// A new file written sequentially while its XXH3-64 checksum is computed. The file is
// removed again unless finish() succeeds.
class HashingFileWriter {
 public:
  explicit HashingFileWriter(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail_errno("create");
  }
  ~HashingFileWriter() {
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(path_.c_str());
    }
  }
  HashingFileWriter(const HashingFileWriter&) = delete;
  HashingFileWriter& operator=(const HashingFileWriter&) = delete;

  void write(const void* data, size_t bytes) {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const size_t chunk = std::min(bytes, kWriteChunkBytes);
      hash_.update(p, chunk);
      write_all(p, chunk);
      p += chunk;
      bytes -= chunk;
    }
  }

  FileDigest finish() {
    if (::fsync(fd_) != 0) fail_errno("fsync");
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) {
      ::unlink(path_.c_str());
      fail_errno("close");
    }
    return {written_, hash_.digest()};
  }

 private:
  void write_all(const char* p, size_t bytes) {
    while (bytes > 0) {
      const ssize_t n = ::write(fd_, p, bytes);
      if (n < 0) {
        if (errno == EINTR) continue;
        fail_errno("write");
      }
      p += n;
      bytes -= static_cast<size_t>(n);
      written_ += static_cast<uint64_t>(n);
    }
  }

  [[noreturn]] void fail_errno(const char* action) const {
    const int err = errno;
    fail(fmt::format("cannot {} '{}': {}", action, path_, std::strerror(err)),
         io_error_hint(err, path_, "check free disk space and permissions"));
  }

  std::string path_;
  int fd_ = -1;
  uint64_t written_ = 0;
  StreamingHash64 hash_;
};

// The JSON header, written by hand: keys stay in tensor order (readable with `head -c`)
// and building it stays linear in the number of tensors.
std::string build_header(const std::vector<TensorHeader>& tensors,
                         const std::map<std::string, std::string>& metadata,
                         const std::vector<uint64_t>& tensor_bytes) {
  fmt::memory_buffer out;
  auto quoted = [](const std::string& s) { return json(s).dump(); };
  fmt::format_to(std::back_inserter(out), "{{");
  bool first = true;
  if (!metadata.empty()) {
    fmt::format_to(std::back_inserter(out), "\"__metadata__\":{}", json(metadata).dump());
    first = false;
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorHeader& t = tensors[i];
    fmt::format_to(std::back_inserter(out),
                   "{}{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                   first ? "" : ",", quoted(t.name), dtype_name(t.dtype),
                   fmt::join(t.shape, ","), offset, offset + tensor_bytes[i]);
    offset += tensor_bytes[i];
    first = false;
  }
  fmt::format_to(std::back_inserter(out), "}}");
  std::string header(out.data(), out.size());
  // Spaces up to a multiple of 8, so the data part starts 8-byte aligned in the file.
  header.resize((header.size() + 7) / 8 * 8, ' ');
  return header;
}

// Each tensor's size in bytes, after checking its name and shape.
std::vector<uint64_t> checked_tensor_bytes(const std::string& path,
                                           const std::vector<TensorHeader>& tensors) {
  std::vector<uint64_t> tensor_bytes(tensors.size());
  std::set<std::string> names;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorHeader& t = tensors[i];
    if (t.name.empty() || t.name == "__metadata__" || !names.insert(t.name).second)
      fail(fmt::format("{}: cannot write tensor name '{}' (empty, reserved or repeated)", path,
                       t.name));
    if (!byte_size(t.shape, dtype_bytes(t.dtype), &tensor_bytes[i]))
      fail(fmt::format("{}: tensor '{}' has an invalid shape [{}]", path, t.name,
                       fmt::join(t.shape, ", ")));
  }
  return tensor_bytes;
}

}  // namespace

const char* dtype_name(StDtype dtype) { return info_of(dtype).name; }
size_t dtype_bytes(StDtype dtype) { return info_of(dtype).bytes; }

bool parse_dtype(const std::string& name, StDtype* out) {
  for (const auto& d : kDtypes) {
    if (name == d.name) {
      *out = d.dtype;
      return true;
    }
  }
  return false;
}

struct SafetensorsStreamWriter::State {
  std::vector<TensorHeader> tensors;
  std::vector<uint64_t> tensor_bytes;
  size_t next = 0;  // the tensor write_tensor expects
  HashingFileWriter file;
  State(const std::string& path, const std::vector<TensorHeader>& headers)
      : tensors(headers), tensor_bytes(checked_tensor_bytes(path, headers)), file(path) {}
};

SafetensorsStreamWriter::SafetensorsStreamWriter(const std::string& path,
                                                 const std::vector<TensorHeader>& tensors,
                                                 const std::map<std::string, std::string>& metadata)
    : state_(std::make_unique<State>(path, tensors)) {
  const std::string header = build_header(state_->tensors, metadata, state_->tensor_bytes);
  uint8_t header_length[8];
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) header_length[i] = static_cast<uint8_t>(n >> (8 * i));
  state_->file.write(header_length, sizeof header_length);
  state_->file.write(header.data(), header.size());
}

SafetensorsStreamWriter::~SafetensorsStreamWriter() = default;

void SafetensorsStreamWriter::write_tensor(const std::string& name, const void* data) {
  State& s = *state_;
  FOUNDRY_CHECK(s.next < s.tensors.size() && s.tensors[s.next].name == name);
  FOUNDRY_CHECK(data != nullptr || s.tensor_bytes[s.next] == 0);
  s.file.write(data, s.tensor_bytes[s.next]);
  ++s.next;
}

FileDigest SafetensorsStreamWriter::finish() {
  FOUNDRY_CHECK(state_->next == state_->tensors.size());
  return state_->file.finish();
}

FileDigest write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                             const std::map<std::string, std::string>& metadata) {
  std::vector<TensorHeader> headers;
  headers.reserve(tensors.size());
  for (const TensorToWrite& t : tensors) headers.push_back({t.name, t.dtype, t.shape});
  SafetensorsStreamWriter writer(path, headers, metadata);
  for (const TensorToWrite& t : tensors) writer.write_tensor(t.name, t.data);
  return writer.finish();
}

SafetensorsReader::SafetensorsReader(const std::string& path) : file_(path) { parse(); }

namespace {

const char* const kNotSafetensors = "the file is truncated, corrupt or not a safetensors file";

// The header: its 8-byte little-endian length, then that many bytes of one JSON object.
json read_header(const uint8_t* file, size_t file_bytes, const std::string& where,
                 uint64_t* header_bytes) {
  if (file_bytes < 8)
    fail(fmt::format("{}: {} bytes is too short for a safetensors file (it starts with an "
                     "8-byte header length)",
                     where, file_bytes),
         kNotSafetensors);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{file[i]} << (8 * i);
  if (n > file_bytes - 8)
    fail(fmt::format("{}: the header length {} exceeds the {} bytes that follow it", where, n,
                     file_bytes - 8),
         kNotSafetensors);
  if (n > kMaxHeaderBytes)
    fail(fmt::format("{}: the header length {} exceeds the limit of {} bytes", where, n,
                     kMaxHeaderBytes),
         kNotSafetensors);
  const char* text = reinterpret_cast<const char*>(file + 8);
  if (n == 0 || text[0] != '{')
    fail(fmt::format("{}: the header does not start with a JSON object", where), kNotSafetensors);
  json header;
  try {
    header = json::parse(text, text + n);
  } catch (const json::exception& e) {
    fail(fmt::format("{}: the header is not valid JSON: {}", where, e.what()), kNotSafetensors);
  }
  if (!header.is_object())
    fail(fmt::format("{}: the header is not a JSON object", where), kNotSafetensors);
  *header_bytes = n;
  return header;
}

[[noreturn]] void bad_tensor(const std::string& where, const std::string& name,
                             const std::string& what) {
  fail(fmt::format("{}: tensor '{}': {}", where, name, what), kNotSafetensors);
}

// One header entry: its dtype, shape and data offsets, checked against each other and the
// data part (data_bytes from `data`).
TensorView parse_tensor(const std::string& key, const json& value, const uint8_t* data,
                        uint64_t data_bytes, const std::string& where) {
  if (!value.is_object()) bad_tensor(where, key, "the entry is not an object");
  TensorView t;
  t.name = key;
  auto dtype = value.find("dtype");
  if (dtype == value.end() || !dtype->is_string())
    bad_tensor(where, key, "\"dtype\" is missing or not a string");
  if (!parse_dtype(dtype->get<std::string>(), &t.dtype))
    bad_tensor(where, key, fmt::format("unknown dtype {}", dtype->dump()));
  auto shape = value.find("shape");
  if (shape == value.end() || !shape->is_array())
    bad_tensor(where, key, "\"shape\" is missing or not an array");
  for (const auto& d : *shape) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t{INT64_MAX})
      bad_tensor(where, key,
                 fmt::format("shape {} holds a value that is not a size", shape->dump()));
    t.shape.push_back(d.get<int64_t>());
  }
  auto offsets = value.find("data_offsets");
  if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned())
    bad_tensor(where, key, "\"data_offsets\" is not a pair of non-negative integers");
  const uint64_t begin = (*offsets)[0].get<uint64_t>();
  const uint64_t end = (*offsets)[1].get<uint64_t>();
  if (begin > end)
    bad_tensor(where, key, fmt::format("data_offsets [{}, {}] end before they begin", begin, end));
  if (end > data_bytes)
    bad_tensor(where, key,
               fmt::format("data_offsets [{}, {}] reach past the {} bytes of data", begin, end,
                           data_bytes));
  uint64_t expected = 0;
  const bool sized = byte_size(t.shape, dtype_bytes(t.dtype), &expected);
  if (!sized || expected != end - begin)
    bad_tensor(
        where, key,
        fmt::format("dtype {} with shape {} needs {} bytes, data_offsets [{}, {}] hold {}",
                    dtype_name(t.dtype), shape->dump(),
                    sized ? std::to_string(expected) : "more than 2^64", begin, end, end - begin));
  t.data = data + begin;
  t.bytes = end - begin;
  t.data_begin = begin;
  return t;
}

// The tensors must tile the data part exactly: sorts them by offset and names the first gap,
// overlap or trailing bytes.
void check_tiling(std::vector<TensorView>& tensors, uint64_t data_bytes, const std::string& where) {
  std::stable_sort(tensors.begin(), tensors.end(), [](const TensorView& a, const TensorView& b) {
    return a.data_begin != b.data_begin ? a.data_begin < b.data_begin : a.bytes < b.bytes;
  });
  uint64_t covered = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorView& t = tensors[i];
    if (t.data_begin < covered)
      bad_tensor(where, t.name,
                 fmt::format("its bytes [{}, {}) overlap tensor '{}' (which ends at {})",
                             t.data_begin, t.data_begin + t.bytes, tensors[i - 1].name, covered));
    if (t.data_begin > covered)
      bad_tensor(
          where, t.name,
          fmt::format("data bytes [{}, {}) before it belong to no tensor", covered, t.data_begin));
    covered = t.data_begin + t.bytes;
  }
  if (covered != data_bytes)
    fail(fmt::format("{}: {} bytes of data after the last tensor belong to no tensor", where,
                     data_bytes - covered),
         kNotSafetensors);
}

}  // namespace

void SafetensorsReader::parse() {
  const std::string& where = path();
  uint64_t header_bytes = 0;
  const json header = read_header(file_.data(), file_.size(), where, &header_bytes);
  const uint8_t* data = file_.data() + 8 + header_bytes;
  const uint64_t data_bytes = file_.size() - 8 - header_bytes;
  for (const auto& [key, value] : header.items()) {
    if (key != "__metadata__") {
      tensors_.push_back(parse_tensor(key, value, data, data_bytes, where));
      continue;
    }
    if (!value.is_object())
      fail(fmt::format("{}: \"__metadata__\" is not an object", where), kNotSafetensors);
    for (const auto& [mkey, mvalue] : value.items()) {
      if (!mvalue.is_string())
        fail(fmt::format("{}: \"__metadata__\" value '{}' is not a string", where, mkey),
             kNotSafetensors);
      metadata_[mkey] = mvalue.get<std::string>();
    }
  }
  check_tiling(tensors_, data_bytes, where);
  for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
}

const TensorView* SafetensorsReader::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorView& SafetensorsReader::get(const std::string& name) const {
  const TensorView* t = find(name);
  if (!t)
    fail(fmt::format("{} has no tensor '{}'", path(), name),
         "the file was written for a different model or by a different program");
  return *t;
}

}  // namespace foundry
