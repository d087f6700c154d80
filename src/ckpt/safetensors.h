// The safetensors file format, so any safetensors reader (Hugging Face, PyTorch, numpy)
// can open Foundry's tensors:
//
//   [8 bytes]  N, the header length, unsigned little-endian
//   [N bytes]  a JSON object, padded with spaces so the data starts on an 8-byte boundary:
//              {"__metadata__": {"key": "value", ...},
//               "<tensor name>": {"dtype": "F32", "shape": [r, c], "data_offsets": [b, e]}, ...}
//   [rest]     raw little-endian tensor data; [b, e) is relative to the start of this part
//
// The data part is exactly covered by the tensors: no overlaps, no holes, nothing after
// the last tensor (the rule the reference reader enforces).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/io.h"

namespace foundry {

// The element types safetensors defines, by their header names.
enum class StDtype {
  BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64
};

const char* dtype_name(StDtype dtype);  // "F32", "BF16", ...
size_t dtype_bytes(StDtype dtype);
bool parse_dtype(const std::string& name, StDtype* out);  // false for an unknown name

// A tensor to write: `data` points at numel(shape) * dtype_bytes(dtype) bytes, which go to
// the file straight from there (no staging copy).
struct TensorToWrite {
  std::string name;
  StDtype dtype = StDtype::F32;
  std::vector<int64_t> shape;  // [] is a scalar
  const void* data = nullptr;
};

// What was written: the file's size and its XXH3-64 checksum (the same value hash64()
// gives for the whole file), computed while writing.
struct FileDigest {
  uint64_t bytes = 0;
  uint64_t xxh3_64 = 0;
};

// Writes `tensors` in the given order, contiguously, and fsyncs the file. Not atomic by
// itself: callers that publish the file write it into a temporary name or directory first.
// On failure the partial file is removed. Names must be unique and not "__metadata__".
FileDigest write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                             const std::map<std::string, std::string>& metadata = {});

// A tensor's entry in the header of a file written by SafetensorsStreamWriter.
struct TensorHeader {
  std::string name;
  StDtype dtype = StDtype::F32;
  std::vector<int64_t> shape;
};

// Writes a safetensors file one tensor at a time, so the tensors need not be in memory
// together: the header (from every tensor's name, dtype and shape) goes out first, then
// each tensor's bytes in the declared order. The same checks and file as write_safetensors;
// the partial file is removed unless finish() succeeds.
class SafetensorsStreamWriter {
 public:
  SafetensorsStreamWriter(const std::string& path, const std::vector<TensorHeader>& tensors,
                          const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsStreamWriter();
  SafetensorsStreamWriter(const SafetensorsStreamWriter&) = delete;
  SafetensorsStreamWriter& operator=(const SafetensorsStreamWriter&) = delete;

  // The next tensor's bytes (its name must be the next one declared).
  void write_tensor(const std::string& name, const void* data);
  // Fsyncs and closes the file; fails unless every declared tensor was written.
  FileDigest finish();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// One tensor inside a mapped file; `data` is valid while the reader lives.
struct TensorView {
  std::string name;
  StDtype dtype = StDtype::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  uint64_t bytes = 0;
  uint64_t data_begin = 0;  // offset relative to the start of the data part
};

// Maps a safetensors file and validates all of it before anything can be read: header
// length against the file size, JSON syntax and types, known dtypes, dtype size × shape
// against each byte range, ranges inside the data, no overlaps or holes. Failures throw
// Error naming the file and the offending tensor.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const std::vector<TensorView>& tensors() const { return tensors_; }  // in file order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorView* find(const std::string& name) const;  // nullptr if absent
  const TensorView& get(const std::string& name) const;   // fails naming the file if absent

 private:
  void parse();

  MappedFile file_;
  std::vector<TensorView> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace foundry
