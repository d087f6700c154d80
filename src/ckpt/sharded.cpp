#include "ckpt/sharded.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include "base/error.h"
#include "base/hash.h"
#include "base/io.h"
#include "base/page_slab.h"
#include "ckpt/boxes.h"
#include "ckpt/checkpoint.h"
#include "ckpt/checkpoint_dir.h"
#include "ckpt/fault.h"

namespace foundry {
namespace {

constexpr int64_t kAlign = 64;  // every piece starts at a multiple of this many bytes
constexpr int64_t kF32 = 4;

std::string rank_file_name(int rank) { return fmt::format("rank_{:05d}.bin", rank); }

std::string tensor_name(const ParamInfo& p, const std::string& slab) {
  return slab.empty() ? p.name : p.name + "." + slab;
}

// Calls fn(p, lo, hi) for each tensor overlapping slab elements [begin, end), with the
// overlap as tensor-local flat elements [lo, hi).
template <typename F>
void for_each_tensor_in(const ParamTable& table, int64_t begin, int64_t end, F fn) {
  for (const ParamInfo& p : table.params()) {
    const int64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.numel);
    if (lo < hi) fn(p, lo - p.offset, hi - p.offset);
  }
}

// ---- writing ------------------------------------------------------------------------------

// A file written front to back with checked writes. With direct I/O (O_DIRECT, where the
// filesystem takes it) the bytes go to the device from an aligned staging buffer, bypassing
// the page cache: a checkpoint of gigabytes then costs the writing thread almost no CPU
// (no page-cache pages to allocate and copy into, no writeback beside training) and evicts
// nothing. Elsewhere, and for files overwritten in place, it writes through the page cache.
class ShardFile {
 public:
  // `truncate` false: overwrites an existing file in place (its pages are reused), cut to
  // size when closed.
  ShardFile(std::string path, bool truncate, bool direct) : path_(std::move(path)) {
    const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (truncate ? O_TRUNC : 0);
    if (direct) fd_ = ::open(path_.c_str(), flags | O_DIRECT, 0644);
    if (fd_ >= 0) {
      stage_ = PageSlab<char>(kStageBytes);
    } else {
      fd_ = ::open(path_.c_str(), flags, 0644);
      if (fd_ < 0) fail_io("cannot create");
    }
  }
  ~ShardFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;

  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  bool direct() const { return !stage_.empty(); }
  void pad_to(int64_t align) {
    static const char zeros[kAlign] = {};
    write(zeros, (align - size_ % align) % align);
  }
  void write(const void* data, int64_t bytes) {
    const char* p = static_cast<const char*>(data);
    if (!direct()) {
      write_out(p, bytes);
      return;
    }
    while (bytes > 0) {
      const int64_t n = std::min(bytes, kStageBytes - staged_);
      std::memcpy(stage_.data() + staged_, p, static_cast<size_t>(n));
      staged_ += n;
      size_ += n;
      p += n;
      bytes -= n;
      if (staged_ == kStageBytes) flush_stage();
    }
  }
  void sync_and_close() {
    if (staged_ > 0) {  // the last block, padded to the alignment and cut by the truncate
      const int64_t padded = (staged_ + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
      std::memset(stage_.data() + staged_, 0, static_cast<size_t>(padded - staged_));
      staged_ = padded;
      flush_stage();
    }
    if (::ftruncate(fd_, size_) != 0) fail_io("cannot truncate");
    if (::fsync(fd_) != 0) fail_io("cannot fsync");
    if (::close(fd_) != 0) {
      fd_ = -1;
      fail_io("cannot close");
    }
    fd_ = -1;
  }

 private:
  static constexpr int64_t kStageBytes = int64_t{8} << 20;
  static constexpr int64_t kDirectAlign = 4096;  // offsets and lengths of direct writes

  // Writes the staged bytes at the file offset they belong to (a multiple of the stage).
  void flush_stage() {
    const int64_t at = written_;
    written_ += staged_;
    const int64_t bytes = staged_;
    staged_ = 0;
    write_at(stage_.data(), bytes, at);
  }
  void write_at(const char* p, int64_t bytes, int64_t at) {
    while (bytes > 0) {
      const ssize_t n = ::pwrite(fd_, p, static_cast<size_t>(std::min<int64_t>(bytes, 1 << 30)),
                                 static_cast<off_t>(at));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EINVAL && at == 0 && (::fcntl(fd_, F_GETFL) & O_DIRECT)) {
        // A filesystem that opens with O_DIRECT but refuses its writes: the page cache.
        if (::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_DIRECT) == 0) continue;
      }
      if (n <= 0) fail_io(fmt::format("cannot write {} bytes at offset {} of", bytes, at));
      p += n;
      bytes -= n;
      at += n;
    }
  }
  void write_out(const char* p, int64_t bytes) {
    write_at(p, bytes, size_);
    size_ += bytes;
  }
  [[noreturn]] void fail_io(const std::string& what) {
    const int err = errno;
    fail(fmt::format("{} '{}': {}", what, path_, std::strerror(err)),
         io_error_hint(err, path_, "check the space and permissions of the run directory"));
  }
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;      // bytes written so far (staged included)
  PageSlab<char> stage_;  // direct I/O: the aligned staging buffer (empty: buffered)
  int64_t staged_ = 0;    // bytes in stage_
  int64_t written_ = 0;   // bytes handed to the file from stage_
};

json chunk_checksums(const float* data, int64_t bytes) {
  json sums = json::array();
  const char* p = reinterpret_cast<const char*>(data);
  for (int64_t at = 0; at < bytes; at += kChecksumChunkBytes)
    sums.push_back(
        hash64_hex(hash64(p + at, static_cast<size_t>(std::min(kChecksumChunkBytes, bytes - at)))));
  return sums;
}

// ---- the metadata, parsed ---------------------------------------------------------------------

struct Piece {
  Box box;
  std::vector<BoxRun> runs;
  int file = 0;
  int64_t byte_offset = 0, byte_length = 0;
  std::vector<std::string> chunk_sums;
};

struct SavedTensor {
  std::vector<int64_t> shape;
  std::vector<Piece> pieces;
};

struct Metadata {
  std::string dir, path;
  json j;
  std::vector<std::string> files;
  std::vector<int64_t> file_bytes;
  std::map<std::string, SavedTensor> tensors;
};

template <typename T>
T field(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end()) fail(fmt::format("{}: \"{}\" is missing", where, key), kCorruptHint);
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    fail(fmt::format("{}: \"{}\" has the wrong type ({})", where, key, it->dump()), kCorruptHint);
  }
}

Piece parse_piece(const json& e, const Metadata& m, const std::string& where) {
  Piece p;
  p.box.offsets = field<std::vector<int64_t>>(e, "offsets", where);
  p.box.lengths = field<std::vector<int64_t>>(e, "lengths", where);
  p.file = field<int>(e, "file", where);
  p.byte_offset = field<int64_t>(e, "byte_offset", where);
  p.byte_length = field<int64_t>(e, "byte_length", where);
  p.chunk_sums = field<std::vector<std::string>>(e, "xxh3_64", where);
  if (p.file < 0 || p.file >= static_cast<int>(m.files.size()))
    fail(fmt::format("{}: file index {} is not listed", where, p.file), kCorruptHint);
  const int64_t chunks = (p.byte_length + kChecksumChunkBytes - 1) / kChecksumChunkBytes;
  if (p.byte_offset < 0 || p.byte_length != p.box.numel() * kF32 ||
      p.byte_offset + p.byte_length > m.file_bytes[p.file] ||
      static_cast<int64_t>(p.chunk_sums.size()) != chunks)
    fail(fmt::format("{}: bytes [{}, {}) of {} do not hold the box it describes", where,
                     p.byte_offset, p.byte_offset + p.byte_length, m.files[p.file]),
         kCorruptHint);
  return p;
}

void parse_pieces(Metadata& m) {
  const json tensors = field<json>(m.j, "tensors", m.path);
  for (const auto& [name, t] : tensors.items()) {
    const std::string where = fmt::format("{}: tensor '{}'", m.path, name);
    m.tensors[name].shape = field<std::vector<int64_t>>(t, "shape", where);
    check_shape(m.tensors[name].shape, where);
    if (field<std::string>(t, "dtype", where) != "F32")
      fail(fmt::format("{}: dtype {} is not supported (F32 only)", where, t["dtype"].dump()),
           kCorruptHint);
  }
  const json pieces = field<json>(m.j, "pieces", m.path);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const std::string where = fmt::format("{}: piece {}", m.path, i);
    const std::string name = field<std::string>(pieces[i], "tensor", where);
    auto t = m.tensors.find(name);
    if (t == m.tensors.end())
      fail(fmt::format("{}: tensor '{}' is not listed", where, name), kCorruptHint);
    Piece p = parse_piece(pieces[i], m, where);
    check_box(t->second.shape, p.box, where.c_str());
    p.runs = box_runs(t->second.shape, p.box);
    t->second.pieces.push_back(std::move(p));
  }
}

Metadata read_metadata(const std::string& dir) {
  verify_sharded_checkpoint(dir);
  Metadata m;
  m.dir = dir;
  m.path = join(dir, kMetadataFile);
  m.j = parse_json_text(read_text_file(m.path), m.path);
  // The checksums are of chunks of this size: another would make every one of them wrong.
  if (const int64_t chunk = field<int64_t>(m.j, "chunk_bytes", m.path);
      chunk != kChecksumChunkBytes)
    fail(fmt::format("{}: chunk_bytes = {}, but this format's checksums are of {}-byte chunks",
                     m.path, chunk, kChecksumChunkBytes),
         kCorruptHint);
  const json files = field<json>(m.j, "files", m.path);
  for (const json& f : files) {
    m.files.push_back(field<std::string>(f, "name", m.path));
    m.file_bytes.push_back(field<int64_t>(f, "bytes", m.path));
  }
  parse_pieces(m);
  return m;
}

// ---- reading ----------------------------------------------------------------------------------

// Reads byte ranges of pieces chunk by chunk, verifying each chunk it reads.
class PieceReader {
 public:
  explicit PieceReader(const Metadata& m) : m_(m), fds_(m.files.size(), -1) {}
  ~PieceReader() {
    for (int fd : fds_)
      if (fd >= 0) ::close(fd);
  }
  PieceReader(const PieceReader&) = delete;
  PieceReader& operator=(const PieceReader&) = delete;

  // Copies bytes [begin, end) of piece `p` of tensor `name` to `out`.
  void read(const std::string& name, const Piece& p, int64_t begin, int64_t end, char* out) {
    constexpr int64_t kWindowChunks = 64;  // the bound on the read buffer: 64 MiB
    int64_t chunk = begin / kChecksumChunkBytes;
    const int64_t last = (end + kChecksumChunkBytes - 1) / kChecksumChunkBytes;
    while (chunk < last) {
      const int64_t n = std::min(kWindowChunks, last - chunk);
      const int64_t lo = chunk * kChecksumChunkBytes;
      const int64_t hi = std::min((chunk + n) * kChecksumChunkBytes, p.byte_length);
      buffer_.resize(static_cast<size_t>(hi - lo));
      pread_all(p.file, p.byte_offset + lo, hi - lo, buffer_.data());
      for (int64_t c = chunk; c < chunk + n; ++c) verify_chunk(name, p, c, lo);
      const int64_t from = std::max(begin, lo), to = std::min(end, hi);
      std::memcpy(out + (from - begin), buffer_.data() + (from - lo),
                  static_cast<size_t>(to - from));
      chunk += n;
    }
  }

 private:
  void verify_chunk(const std::string& name, const Piece& p, int64_t c, int64_t window_begin) {
    const int64_t lo = c * kChecksumChunkBytes;
    const int64_t hi = std::min(lo + kChecksumChunkBytes, p.byte_length);
    const std::string sum =
        hash64_hex(hash64(buffer_.data() + (lo - window_begin), static_cast<size_t>(hi - lo)));
    if (sum != p.chunk_sums[static_cast<size_t>(c)])
      fail(fmt::format("{}: bytes [{}, {}) (tensor '{}') fail their XXH3-64 checksum ({} read, "
                       "{} recorded)",
                       join(m_.dir, m_.files[p.file]), p.byte_offset + lo, p.byte_offset + hi, name,
                       sum, p.chunk_sums[static_cast<size_t>(c)]),
           kCorruptHint);
  }
  void pread_all(int file, int64_t offset, int64_t bytes, char* out) {
    const std::string path = join(m_.dir, m_.files[file]);
    if (fds_[file] < 0) {
      fds_[file] = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fds_[file] < 0)
        fail(fmt::format("cannot open '{}': {}", path, std::strerror(errno)), kCorruptHint);
    }
    while (bytes > 0) {
      const ssize_t n = ::pread(fds_[file], out, static_cast<size_t>(bytes), offset);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        fail(fmt::format("cannot read bytes [{}, {}) of '{}': {}", offset, offset + bytes, path,
                         n == 0 ? "the file is shorter" : std::strerror(errno)),
             kCorruptHint);
      out += n;
      offset += n;
      bytes -= n;
    }
  }

  const Metadata& m_;
  std::vector<int> fds_;
  std::vector<char> buffer_;
};

// Fills tensor-local elements [lo, hi) of `name` into out[0 .. hi − lo) from the pieces
// that overlap them; fails unless they cover the range exactly.
void read_tensor_range(const Metadata& m, PieceReader& reader, const std::string& name, int64_t lo,
                       int64_t hi, float* out) {
  auto t = m.tensors.find(name);
  if (t == m.tensors.end())
    fail(fmt::format("{} has no tensor '{}'", m.dir, name),
         "the checkpoint was written for another model or optimizer");
  int64_t covered = 0;
  for (const Piece& p : t->second.pieces)
    for (const BoxRun& r : p.runs) {
      const int64_t a = std::max(lo, r.begin), b = std::min(hi, r.end);
      if (a >= b) continue;
      const int64_t at = (r.box_offset + (a - r.begin)) * kF32;
      reader.read(name, p, at, at + (b - a) * kF32, reinterpret_cast<char*>(out + (a - lo)));
      covered += b - a;
    }
  if (covered != hi - lo)
    fail(fmt::format("{}: tensor '{}' elements [{}, {}) are {} in the checkpoint ({} of {} "
                     "found)",
                     m.dir, name, lo, hi, covered < hi - lo ? "not all" : "more than once", covered,
                     hi - lo),
         kCorruptHint);
}

// Every element of tensor `name` (numel elements) covered exactly once by its pieces.
void check_exact_cover(const Metadata& m, const std::string& name, int64_t numel) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (const Piece& p : m.tensors.at(name).pieces)
    for (const BoxRun& r : p.runs) runs.push_back({r.begin, r.end});
  std::sort(runs.begin(), runs.end());
  int64_t at = 0;
  for (const auto& [b, e] : runs) {
    if (b != at)
      fail(fmt::format("{}: tensor '{}' elements {} are {}", m.path, name,
                       b > at ? fmt::format("[{}, {})", at, b) : fmt::format("from {}", b),
                       b > at ? "in no piece" : "in two pieces"),
           kCorruptHint);
    at = e;
  }
  if (at != numel)
    fail(fmt::format("{}: tensor '{}' elements [{}, {}) are in no piece", m.path, name, at, numel),
         kCorruptHint);
}

}  // namespace

// ---- public ----------------------------------------------------------------------------------

std::string staging_dir(const std::string& run_dir, int64_t step, const std::string& tag) {
  return join(checkpoints_root(run_dir), fmt::format("{}.{}.tmp", checkpoint_dir_name(step), tag));
}

json write_rank_shard(const std::string& staging, int rank, const ParamTable& table,
                      const std::vector<SlabRun>& runs, const std::string& recycle_dir) {
  make_dirs(staging);
  const std::string name = rank_file_name(rank);
  const bool reuse = !recycle_dir.empty() &&
                     ::rename(join(recycle_dir, name).c_str(), join(staging, name).c_str()) == 0;
  // A recycled file is overwritten in its (RAM-backed) pages; a new one goes to the device.
  ShardFile file(join(staging, name), /*truncate=*/!reuse, /*direct=*/recycle_dir.empty());
  json pieces = json::array();
  for (const SlabRun& run : runs) {
    if (runs.size() > 1 && &run == &runs[1])  // once a save: parameters written, states not
      checkpoint_fault_point(CheckpointFault::disk_full, file.path());
    for_each_tensor_in(table, run.begin, run.end, [&](const ParamInfo& p, int64_t lo, int64_t hi) {
      int64_t at = lo;
      for (const Box& box : flat_range_to_boxes(p.shape, lo, hi)) {
        const float* data = run.data + (p.offset + at - run.begin);
        const int64_t bytes = box.numel() * kF32;
        file.pad_to(kAlign);
        pieces.push_back({{"tensor", tensor_name(p, run.slab)},
                          {"offsets", box.offsets},
                          {"lengths", box.lengths},
                          {"byte_offset", file.size()},
                          {"byte_length", bytes},
                          {"xxh3_64", chunk_checksums(data, bytes)}});
        file.write(data, bytes);
        at += box.numel();
      }
    });
  }
  checkpoint_fault_point(CheckpointFault::before_fsync, join(staging, name));
  file.sync_and_close();
  fsync_path(staging);
  return {{"file", name},
          {"bytes", file.size()},
          {"direct_io", file.direct()},
          {"pieces", std::move(pieces)}};
}

namespace {

// The metadata from the ranks' descriptions; pieces name their file by index.
json build_metadata(int64_t step, const ModelConfig& config, const ParamTable& table,
                    const std::vector<json>& shards, const json& trainer_state,
                    const SavedLayout& layout) {
  json files = json::array(), pieces = json::array(), tensors = json::object();
  std::map<std::string, const ParamInfo*> by_name;
  for (const ParamInfo& p : table.params()) by_name[p.name] = &p;
  for (size_t f = 0; f < shards.size(); ++f) {
    files.push_back({{"name", shards[f].at("file")}, {"bytes", shards[f].at("bytes")}});
    for (json piece : shards[f].at("pieces")) {
      const std::string name = piece.at("tensor");
      const std::string param = name.substr(0, by_name.count(name) ? name.size() : name.rfind('.'));
      FOUNDRY_CHECK(by_name.count(param) == 1);
      tensors[name] = {{"shape", by_name[param]->shape}, {"dtype", "F32"}};
      piece["file"] = f;
      pieces.push_back(std::move(piece));
    }
  }
  return {{"format", "foundry-checkpoint"},
          {"format_version", kShardedFormatVersion},
          {"step", step},
          {"chunk_bytes", kChecksumChunkBytes},
          {"layout",
           {{"world", layout.world},
            {"expert_parallel", layout.expert_parallel},
            {"zero1", layout.zero1},
            {"context_parallel", layout.context_parallel}}},
          {"model", to_json(config)},
          {"trainer_state", trainer_state},
          {"files", std::move(files)},
          {"tensors", std::move(tensors)},
          {"pieces", std::move(pieces)}};
}

}  // namespace

std::string commit_sharded_checkpoint(const std::string& run_dir, const std::string& staging,
                                      int64_t step, const ModelConfig& config,
                                      const ParamTable& table, const std::vector<json>& shards,
                                      const json& trainer_state, const SavedLayout& layout,
                                      int64_t keep_last) {
  const json metadata = build_metadata(step, config, table, shards, trainer_state, layout);
  const FileDigest digest = write_json_file(join(staging, kMetadataFile), metadata);
  {  // every parameter element saved exactly once, before anything is committed
    Metadata m;
    m.dir = staging;
    m.path = join(staging, kMetadataFile);
    m.j = metadata;
    for (const json& f : metadata["files"]) {
      m.files.push_back(f["name"]);
      m.file_bytes.push_back(f["bytes"]);
    }
    parse_pieces(m);
    for (const ParamInfo& p : table.params()) check_exact_cover(m, p.name, p.numel);
    for (const auto& [name, t] : m.tensors) {
      int64_t numel = 1;
      for (int64_t d : t.shape) numel *= d;
      check_exact_cover(m, name, numel);
    }
  }
  write_json_file(join(staging, kConfigFile), hf_config_json(config));
  checkpoint_fault_point(CheckpointFault::before_commit, staging);
  fsync_path(staging);
  write_json_file(join(staging, kCommittedFile),
                  {{"format_version", kShardedFormatVersion},
                   {"metadata_xxh3_64", hash64_hex(digest.xxh3_64)}});
  const std::string root = checkpoints_root(run_dir);
  remove_leftovers(root, staging);
  const std::string name = checkpoint_dir_name(step);
  const std::string final_dir = join(root, name);
  publish_dir(staging, final_dir);
  fsync_path(root);
  // Committed: what follows only tidies up, and its failures do not undo the checkpoint.
  try {
    checkpoint_fault_point(CheckpointFault::before_latest, final_dir);
    write_latest(root, name);
  } catch (const Error& e) {
    // The old pointer would send a resume to the checkpoint before: it goes (a removal needs
    // no space), and the scan finds this one.
    const std::string latest = join(root, kLatestFile);
    std::error_code ec;
    std::filesystem::remove(latest, ec);
    if (!ec) try {
        fsync_path(root);  // the removal survives a power loss
      } catch (const Error&) {
      }
    warn(ec ? fmt::format("checkpoint {} is saved, but {}, and the old {} could not be removed "
                          "({}): a resume would load the checkpoint it names; remove it",
                          final_dir, e.what(), latest, ec.message())
            : fmt::format("checkpoint {} is saved, but {}: {} was removed, and a resume finds "
                          "the checkpoint by scanning {}",
                          final_dir, e.what(), latest, root));
  }
  try {
    apply_retention(run_dir, step, keep_last);
  } catch (const Error& e) {
    warn(fmt::format("checkpoint {} is saved, but an older one stays: {}", final_dir, e.what()));
  }
  return final_dir;
}

bool is_sharded_checkpoint(const std::string& dir) { return path_exists(join(dir, kMetadataFile)); }

void verify_sharded_checkpoint(const std::string& dir) {
  const std::string committed_path = join(dir, kCommittedFile);
  if (!path_exists(committed_path))
    fail(fmt::format("{}: no {} marker: the save did not finish", dir, kCommittedFile),
         kCorruptHint);
  const json committed = parse_json_text(read_text_file(committed_path), committed_path);
  const std::string path = join(dir, kMetadataFile);
  if (!path_exists(path)) fail(fmt::format("{} is missing", path), kCorruptHint);
  const std::string text = read_text_file(path);
  const std::string sum = hash64_hex(hash64(text.data(), text.size()));
  const std::string& recorded = string_field(committed, "metadata_xxh3_64", committed_path);
  if (sum != recorded)
    fail(fmt::format("{}: XXH3-64 checksum {} does not match {} recorded in {}", path, sum,
                     recorded, committed_path),
         kCorruptHint);
  const json m = parse_json_text(text, path);
  if (field<int>(m, "format_version", path) != kShardedFormatVersion)
    fail(fmt::format("{}: format_version {} is not supported (this Foundry reads version {})", path,
                     m["format_version"].dump(), kShardedFormatVersion),
         "load it with the Foundry version that wrote it");
  const json files = field<json>(m, "files", path);
  for (const json& f : files) {
    const std::string name = field<std::string>(f, "name", path);
    const int64_t bytes = field<int64_t>(f, "bytes", path);
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
      fail(fmt::format("{}: lists an invalid file name '{}'", path, name), kCorruptHint);
    const std::string file = join(dir, name);
    std::error_code ec;
    const auto size = std::filesystem::file_size(file, ec);
    if (ec) fail(fmt::format("{} is missing (listed in {})", file, path), kCorruptHint);
    if (static_cast<int64_t>(size) != bytes)
      fail(fmt::format("{} has {} bytes, {} lists {}", file, size, path, bytes), kCorruptHint);
  }
}

json read_sharded_metadata(const std::string& dir) { return read_metadata(dir).j; }

json load_sharded_checkpoint(const std::string& dir, const ModelConfig& expected,
                             const ParamTable& table, const std::vector<SlabTarget>& targets,
                             const std::function<void()>& on_tensor) {
  const Metadata m = read_metadata(dir);
  check_same_model(dir, parse_model_config(field<json>(m.j, "model", m.path), m.path), expected);
  PieceReader reader(m);
  for (const SlabTarget& t : targets) {
    if (&t == &targets.back()) checkpoint_fault_point(CheckpointFault::load, dir);
    FOUNDRY_CHECK(t.data != nullptr || t.begin == t.end);
    for_each_tensor_in(table, t.begin, t.end, [&](const ParamInfo& p, int64_t lo, int64_t hi) {
      read_tensor_range(m, reader, tensor_name(p, t.slab), lo, hi,
                        t.data + (p.offset + lo - t.begin));
      if (on_tensor) on_tensor();
    });
  }
  return field<json>(m.j, "trainer_state", m.path);
}

std::map<std::string, int64_t> verify_sharded_data(const std::string& dir) {
  const Metadata m = read_metadata(dir);
  PieceReader reader(m);
  std::vector<float> out;
  std::map<std::string, int64_t> non_finite;
  for (const auto& [name, t] : m.tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    check_exact_cover(m, name, numel);
    for (const Piece& p : t.pieces) {
      out.resize(static_cast<size_t>(std::min(p.byte_length, 64 * kChecksumChunkBytes) / kF32));
      const int64_t step = static_cast<int64_t>(out.size()) * kF32;
      for (int64_t at = 0; at < p.byte_length; at += step) {
        const int64_t end = std::min(p.byte_length, at + step);
        reader.read(name, p, at, end, reinterpret_cast<char*>(out.data()));
        const int64_t bad = std::count_if(out.data(), out.data() + (end - at) / kF32,
                                          [](float x) { return !std::isfinite(x); });
        if (bad > 0) non_finite[name] += bad;
      }
    }
  }
  return non_finite;
}

}  // namespace foundry
