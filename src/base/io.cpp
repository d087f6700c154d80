#include "base/io.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string_view>
#include <utility>
#include <vector>

#include "base/error.h"

namespace foundry {
namespace {

[[noreturn]] void fail_errno(const std::string& action, const std::string& path) {
  const int err = errno;
  fail(fmt::format("cannot {} '{}': {}", action, path, std::strerror(err)),
       io_error_hint(err, path, "check that the path exists and is accessible"));
}

constexpr int kHintedErrors[] = {ENOSPC, EDQUOT, EROFS, EACCES, EPERM, EFBIG, EIO};

}  // namespace

std::string io_error_hint(int err, const std::string& path, const std::string& otherwise) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  const std::string dir = parent.empty() ? "." : parent;
  switch (err) {
    case ENOSPC:
      return fmt::format(
          "the file system holding '{}' is full: free space there (df -h '{}' "
          "shows it)",
          dir, dir);
    case EDQUOT:
      return fmt::format(
          "your disk quota on the file system holding '{}' is used up: free "
          "space there",
          dir);
    case EROFS:
      return fmt::format(
          "'{}' is on a read-only file system: write somewhere else, or remount "
          "it read-write",
          dir);
    case EACCES:
    case EPERM:
      return fmt::format(
          "permission denied: check the owner and mode of '{}' and of '{}' (and "
          "lsattr for the immutable attribute)",
          path, dir);
    case EFBIG:
      return "the file would exceed the size limit on files (ulimit -f, or the file system's "
             "own): raise it or write somewhere else";
    case EIO:
      return fmt::format(
          "the storage holding '{}' reported an I/O error: check the device "
          "(dmesg) before trusting what was written there",
          dir);
    default:
      return otherwise;
  }
}

std::string io_error_hint(const std::string& message, const std::string& path,
                          const std::string& otherwise) {
  for (const int err : kHintedErrors)
    if (message.find(std::strerror(err)) != std::string::npos)
      return io_error_hint(err, path, otherwise);
  return otherwise;
}

std::string read_text_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    fail(fmt::format("cannot read '{}': it is a directory, not a file", path),
         "name the file inside it");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_errno("open", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail_errno("read", path);
  return ss.str();
}

std::vector<uint8_t> read_binary_file(const std::string& path) {
  std::string text = read_text_file(path);
  return std::vector<uint8_t>(text.begin(), text.end());
}

std::ifstream open_text_file(const std::string& path, const std::string& what,
                             const std::string& hint) {
  std::ifstream in(path);
  std::error_code ec;
  const bool directory = std::filesystem::is_directory(path, ec);
  if (!in || directory)
    fail(fmt::format("cannot read {} '{}'{}", what, path, directory ? ": it is a directory" : ""),
         hint);
  return in;
}

void check_output_file(const std::string& option, const std::string& path,
                       const std::vector<std::pair<std::string, std::string>>& inputs,
                       const std::function<bool(const std::string& contents)>& ours) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // One file under two spellings: the same file once both exist, else the same path once
  // links and "."/".." are resolved (a file neither command run has made yet).
  const auto resolved = [](const std::string& p) {
    std::error_code e;
    const fs::path r = fs::weakly_canonical(fs::absolute(p, e), e);
    return e ? fs::path(p) : r;
  };
  for (const auto& [input_option, input] : inputs) {
    if (input.empty()) continue;
    if (input == path ||
        (fs::exists(input, ec) && fs::exists(path, ec) && fs::equivalent(input, path, ec)) ||
        resolved(input) == resolved(path))
      fail(fmt::format("{} '{}' is the {} file", option, path, input_option),
           fmt::format("write to another file: {} would overwrite the file {} names", option,
                       input_option));
  }
  if (fs::is_directory(path, ec))
    fail(fmt::format("{} '{}' is a directory", option, path), "name a file to write");
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec))
    fail(fmt::format("{} '{}': the directory '{}' does not exist", option, path, parent.string()),
         "create it first, or name a file in an existing directory");
  // Only a regular file's contents are judged: a pipe or device (--trace /dev/stderr) is
  // written as it is.
  if (!ours || !fs::is_regular_file(path, ec) || is_stream_file(path)) return;
  const std::string contents = read_text_file(path);
  if (contents.find_first_not_of(" \t\r\n") == std::string::npos || ours(contents)) return;
  fail(fmt::format("{} '{}' already holds something this command did not write", option, path),
       fmt::format("name a new file for {}, or remove this one if it is not needed", option));
}

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail_errno("open for fsync", path);
  if (::fsync(fd) != 0) {
    ::close(fd);
    fail_errno("fsync", path);
  }
  ::close(fd);
}

namespace {

// Writes all of `data` to `fd`, failing naming `path`.
void write_all(int fd, const std::string& path, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  size_t left = bytes;
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno("write", path);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

// `path`, then where each symbolic link along the way points (a relative target taken from the
// link's folder), up to the first path that is no link (which may not exist yet).
std::vector<std::filesystem::path> link_chain(const std::string& path) {
  namespace fs = std::filesystem;
  std::vector<fs::path> chain = {path};
  for (std::error_code ec; fs::is_symlink(chain.back(), ec);) {
    if (chain.size() > 40)
      fail(fmt::format("'{}': too many levels of symbolic links", path), "fix the link");
    const fs::path target = fs::read_symlink(chain.back(), ec);
    if (ec) break;
    chain.push_back(target.is_absolute() ? target : chain.back().parent_path() / target);
  }
  return chain;
}

// The descriptor a path names when it is one of this process's own (/dev/stdout, /dev/stderr,
// /dev/fd/N, /proc/self/fd/N, or a link to one): what the shell redirected it to is written
// through that descriptor, after what the process printed, not replaced or overwritten.
std::optional<int> own_descriptor(const std::string& path) {
  for (const std::filesystem::path& p : link_chain(path)) {
    const std::string text = p.lexically_normal().string();
    if (text == "/dev/stdout") return 1;
    if (text == "/dev/stderr") return 2;
    for (const char* prefix : {"/dev/fd/", "/proc/self/fd/"})
      if (text.starts_with(prefix)) {
        const std::string digits = text.substr(std::string_view(prefix).size());
        if (!digits.empty() && digits.size() < 9 &&
            digits.find_first_not_of("0123456789") == std::string::npos)
          return std::stoi(digits);
      }
  }
  return std::nullopt;
}

}  // namespace

bool is_stream_file(const std::string& path) {
  if (own_descriptor(path)) return true;
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode);
}

void write_file_atomic(const std::string& given, const void* data, size_t bytes) {
  // One of this process's own descriptors (--out /dev/stdout): written through it, after what
  // was printed to it so far.
  if (const std::optional<int> fd = own_descriptor(given)) {
    std::fflush(nullptr);
    write_all(*fd, given, data, bytes);
    return;
  }
  // A pipe or device (a FIFO) is written as it is: there is nothing to replace.
  if (is_stream_file(given)) {
    const int fd = ::open(given.c_str(), O_WRONLY);
    if (fd < 0) fail_errno("open for writing", given);
    try {
      write_all(fd, given, data, bytes);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
    return;
  }
  AtomicFileWriter file(given);
  file.write(data, bytes);
  file.commit();
}

namespace {

constexpr int64_t kLineBlockBytes = int64_t{1} << 16;

// An open descriptor of `path` for reading (-1: no such file), closed with the object.
struct ReadFd {
  explicit ReadFd(const std::string& path) : fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd < 0 && errno != ENOENT) fail_errno("open", path);
  }
  ~ReadFd() {
    if (fd >= 0) ::close(fd);
  }
  ReadFd(const ReadFd&) = delete;
  ReadFd& operator=(const ReadFd&) = delete;
  int fd;
};

}  // namespace

void for_each_line_from_end(
    const std::string& path,
    const std::function<bool(std::string_view line, int64_t offset)>& visit) {
  const ReadFd file(path);
  struct stat st {};
  if (file.fd < 0) return;
  if (::fstat(file.fd, &st) != 0) fail_errno("stat", path);
  int64_t pos = st.st_size;
  if (pos == 0) return;
  std::string pending;  // the file's bytes [pos, the end of the lines not visited yet)
  for (bool last_block = true; pos > 0; last_block = false) {
    const int64_t n = std::min(kLineBlockBytes, pos);
    pos -= n;
    std::string block(static_cast<size_t>(n), '\0');
    for (int64_t done = 0; done < n;) {
      const ssize_t got = ::pread(file.fd, block.data() + done, static_cast<size_t>(n - done),
                                  static_cast<off_t>(pos + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) fail_errno("read", path);
      done += got;
    }
    pending.insert(0, block);
    if (last_block && pending.back() == '\n') pending.pop_back();
    for (size_t nl; (nl = pending.rfind('\n')) != std::string::npos; pending.resize(nl))
      if (!visit(std::string_view(pending).substr(nl + 1), pos + static_cast<int64_t>(nl) + 1))
        return;
  }
  visit(pending, 0);
}

int64_t count_lines(const std::string& path) {
  const ReadFd file(path);
  if (file.fd < 0) return 0;
  std::string block(static_cast<size_t>(kLineBlockBytes), '\0');
  int64_t lines = 0;
  char last = '\n';
  for (ssize_t got; (got = ::read(file.fd, block.data(), block.size())) != 0;) {
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail_errno("read", path);
    lines += std::count(block.data(), block.data() + got, '\n');
    last = block[static_cast<size_t>(got) - 1];
  }
  return lines + (last != '\n');
}

// Through a symbolic link: the file it names is replaced, and the link stays.
namespace {

// The copies "PATH.tmp.PID" that writers of `path` killed before their commit left (a
// process that ends normally removes its own): those whose process is gone.
void remove_abandoned_copies(const std::filesystem::path& path) {
  const std::string prefix = path.filename().string() + ".tmp.";
  std::error_code ec;
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : ".";
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(prefix) || name.size() == prefix.size() ||
        name.size() > prefix.size() + 9)
      continue;
    const std::string pid = name.substr(prefix.size());
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::error_code type_ec;
    if (it->is_regular_file(type_ec) && process_gone(std::stoll(pid)))
      std::filesystem::remove(it->path(), type_ec);
  }
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(const std::string& path)
    : path_(link_chain(path).back().string()), tmp_(fmt::format("{}.tmp.{}", path_, ::getpid())) {
  remove_abandoned_copies(path_);
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd_ < 0) fail_errno("create", tmp_);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  constexpr size_t kBuffered = size_t{1} << 20;
  if (buffer_.size() + bytes > kBuffered) flush();
  if (bytes >= kBuffered)
    write_all(fd_, tmp_, data, bytes);
  else
    buffer_.append(static_cast<const char*>(data), bytes);
}

void AtomicFileWriter::flush() {
  write_all(fd_, tmp_, buffer_.data(), buffer_.size());
  buffer_.clear();
}

void AtomicFileWriter::commit() {
  FOUNDRY_CHECK(fd_ >= 0 && !committed_);
  flush();
  const int fd = std::exchange(fd_, -1);
  const bool synced = ::fsync(fd) == 0;
  const int err = errno;
  const bool closed = ::close(fd) == 0;
  if (!synced || !closed) {
    if (!synced) errno = err;
    fail_errno(synced ? "close" : "fsync", tmp_);
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail_errno("rename into", path_);
  committed_ = true;
  const std::string dir = std::filesystem::path(path_).parent_path().string();
  fsync_path(dir.empty() ? "." : dir);
}

bool path_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

void make_dirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) fail(fmt::format("cannot create directory '{}': {}", path, ec.message()),
               "check permissions and free space");
}

bool process_gone(int64_t pid) {
  return pid <= 0 || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH);
}

bool process_ending(int64_t pid) {
  if (process_gone(pid)) return false;
  // /proc/PID/stat: "pid (comm) state ppid pgrp session tty_nr tpgid flags ...", where comm
  // may hold spaces and parentheses: the fields after it follow the last ')'.
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string text;
  if (!in || !std::getline(in, text)) return false;  // gone since, or not ours to read
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream fields(text.substr(close + 1));
  std::string state;
  int64_t skip = 0;
  uint64_t flags = 0;
  fields >> state >> skip >> skip >> skip >> skip >> skip >> flags;
  constexpr uint64_t kExiting = 0x4;  // PF_EXITING: the task has begun to exit
  return state == "Z" || state == "X" || (fields && (flags & kExiting) != 0);
}

std::string make_dirs_outermost(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string outermost;
  for (fs::path p = fs::path(path).lexically_normal(); !p.empty() && !fs::exists(p, ec);
       p = p.parent_path()) {
    outermost = p.string();
    if (p == p.parent_path()) break;
  }
  make_dirs(path);
  return outermost;
}

void remove_empty_dirs(const std::string& path, const std::string& outermost) {
  namespace fs = std::filesystem;
  if (outermost.empty()) return;
  const fs::path stop = fs::path(outermost).lexically_normal();
  std::error_code ec;
  for (fs::path p = fs::path(path).lexically_normal(); !p.empty(); p = p.parent_path()) {
    if (!fs::is_directory(p, ec) || !fs::is_empty(p, ec) || !fs::remove(p, ec)) return;
    if (p == stop || p == p.parent_path()) return;
  }
}

void remove_all(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) fail(fmt::format("cannot remove '{}': {}", path, ec.message()));
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail_errno("open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail_errno("stat", path);
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      fail_errno("mmap", path);
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)), data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    path_ = std::move(o.path_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

std::string host_name() {
  char buf[256] = {};
  return gethostname(buf, sizeof buf - 1) == 0 ? buf : "?";
}

double process_age_seconds() {
  std::ifstream stat("/proc/self/stat"), uptime_file("/proc/uptime");
  std::string line;
  double uptime = 0;
  if (!std::getline(stat, line) || !(uptime_file >> uptime)) return -1;
  const size_t close = line.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return -1;
  std::istringstream fields(line.substr(close + 1));
  std::string field;
  for (int i = 3; i < 22; ++i) fields >> field;  // state (3) .. itrealvalue (21)
  long long start_ticks = 0;
  if (!(fields >> start_ticks)) return -1;
  return uptime - static_cast<double>(start_ticks) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace foundry
