// Checked file I/O: every failure names the path and the system error.
#pragma once
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace foundry {

std::string read_text_file(const std::string& path);
std::vector<uint8_t> read_binary_file(const std::string& path);
// A text file to read line by line: fails naming it as `what` ("the requests file"), with
// `hint`, when it cannot be opened or is a directory.
std::ifstream open_text_file(const std::string& path, const std::string& what,
                             const std::string& hint);

// Writes the whole file durably and atomically: data goes to "<path>.tmp.<pid>", is fsynced,
// renamed over `path`, and the directory is fsynced. Readers see the old file or the new one.
// A symbolic link is followed (the file it names is replaced, the link stays); one of this
// process's own descriptors (/dev/stdout, /dev/fd/N) is written through that descriptor, after
// what was printed to it; a pipe or device (a FIFO) is written as it is.
void write_file_atomic(const std::string& path, const void* data, size_t bytes);
inline void write_file_atomic(const std::string& path, std::string_view text) {
  write_file_atomic(path, text.data(), text.size());
}

// The lines of a text file from its last to its first, read backwards a block at a time (a
// log that grows a line a step is read at its end only): `visit(line, offset)` gets each line
// without its newline and where it starts, until it returns false. A final newline ends the
// last line (no empty line after it); a last line without one is visited as it is. A missing
// file has no lines.
void for_each_line_from_end(
    const std::string& path,
    const std::function<bool(std::string_view line, int64_t offset)>& visit);
// The file's lines (a last one without its newline counts), read a block at a time; 0 for a
// missing file.
int64_t count_lines(const std::string& path);

// A file written in pieces, then replaced atomically at commit() as write_file_atomic replaces
// one ("<path>.tmp.<pid>", fsynced, renamed, the directory fsynced; a symbolic link followed).
// For regular files (and new ones) only. Dropped before commit(), the temporary file goes.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(const std::string& path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t bytes);
  void write(std::string_view text) { write(text.data(), text.size()); }
  void commit();

 private:
  void flush();
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
  std::string buffer_;
};

// An output file a command is about to write (`option` names it, e.g. "--out"), checked
// before any work: it must not be one of the command's input files (`inputs`: option and path
// pairs, empty paths skipped; the same file under any spelling), a directory, or in a directory
// that does not exist; and a file that already holds something is only replaced when `ours`
// (when given) recognizes its contents as what this option writes. Fails naming the option,
// the file and the fix otherwise; nothing is written.
void check_output_file(const std::string& option, const std::string& path,
                       const std::vector<std::pair<std::string, std::string>>& inputs,
                       const std::function<bool(const std::string& contents)>& ours = {});

// Whether `path` (its links followed) is a pipe, device or socket, or one of this process's
// own descriptors: written as a stream, never read back or replaced.
bool is_stream_file(const std::string& path);

void fsync_path(const std::string& path);  // fsync a file or directory

// What to do about a failed file operation on `path` with errno `err`: a full file system or
// quota, a read-only one, a permission, a file size limit and an I/O error each get their own
// advice naming where; any other error gets `otherwise`.
std::string io_error_hint(int err, const std::string& path, const std::string& otherwise);
// The same from an error's text (as it travels between ranks): "No space left on device" and
// the others above, as strerror spells them.
std::string io_error_hint(const std::string& message, const std::string& path,
                          const std::string& otherwise);
std::string host_name();                   // this host's name ("?" if unknown)
// Seconds since this process started (from /proc/self/stat and /proc/uptime); -1 if unknown.
double process_age_seconds();
// Whether process `pid` of this host has ended (pid <= 0 counts as ended): what it left behind
// (a staging folder named by its pid) may be removed.
bool process_gone(int64_t pid);
// Whether process `pid` of this host is ending: its exit under way (a zombie, or a task the
// kernel marks as exiting while it closes its files and releases its locks). False for a live
// process, one that is gone, and one whose /proc entry cannot be read.
bool process_ending(int64_t pid);
bool path_exists(const std::string& path);
void make_dirs(const std::string& path);   // mkdir -p
// mkdir -p that returns the outermost directory it created ("" when `path` existed), so that
// a command that fails can take back what it made (remove_empty_dirs).
std::string make_dirs_outermost(const std::string& path);
// Removes `path` and then its parents, up to and including `outermost`, while they are empty
// (nothing when `outermost` is "").
void remove_empty_dirs(const std::string& path, const std::string& outermost);
void remove_all(const std::string& path);  // rm -rf (no error if absent)

// A read-only memory map of a whole file. Empty files map to {nullptr, 0}.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace foundry
