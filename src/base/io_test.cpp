#include "base/io.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/test_expect_error.h"
#include "base/test_temp_dir.h"

namespace foundry {
namespace {

using testing::TempDir;

bool starts_with_ours(const std::string& contents) { return contents.rfind("ours", 0) == 0; }

// An output is never one of the command's inputs, under any spelling of its path.
TEST(CheckOutputFile, AnInputOfTheCommandIsRefusedUnderAnySpelling) {
  TempDir dir;
  write_file_atomic(dir.file("run.json"), "{}\n");
  const std::string other_spelling = dir.path() + "/./run.json";
  expect_error(
      [&] { check_output_file("--out", other_spelling, {{"--config", dir.file("run.json")}}); },
      "--out '" + other_spelling + "' is the --config file");
  // An input that does not exist yet is no obstacle; nor is an empty input path.
  check_output_file("--out", dir.file("new.json"),
                    {{"--config", dir.file("absent.json")}, {"--tokenizer", ""}});
  // Two outputs neither of which exists yet, one file under two spellings (generate's --trace
  // and --out): the second would replace the first.
  const std::string spelled = dir.path() + "/sub/../res.jsonl";
  make_dirs(dir.file("sub"));
  expect_error(
      [&] {
        check_output_file("--trace", spelled, {{"--out", dir.file("res.jsonl")}});
      },
      "--trace '" + spelled + "' is the --out file");
}

TEST(CheckOutputFile, ADirectoryOrAMissingDirectoryIsRefused) {
  TempDir dir;
  expect_error([&] { check_output_file("--out", dir.path(), {}); }, "is a directory");
  expect_error([&] { check_output_file("--json", dir.file("none/x.json"), {}); },
               "the directory '" + dir.file("none") + "' does not exist");
  check_output_file("--out", "relative-with-no-directory.json", {});  // the working directory
}

// An existing file is replaced only when it holds what the option writes, or nothing.
TEST(CheckOutputFile, AnExistingFileIsReplacedOnlyWhenItIsTheOptionsOwn) {
  TempDir dir;
  write_file_atomic(dir.file("mine.txt"), "my notes\n");
  expect_error([&] { check_output_file("--out", dir.file("mine.txt"), {}, starts_with_ours); },
               "already holds something this command did not write");
  EXPECT_EQ(read_text_file(dir.file("mine.txt")), "my notes\n");
  write_file_atomic(dir.file("ours.txt"), "ours, from an earlier run\n");
  check_output_file("--out", dir.file("ours.txt"), {}, starts_with_ours);
  write_file_atomic(dir.file("empty.txt"), "\n");
  check_output_file("--out", dir.file("empty.txt"), {}, starts_with_ours);
  // Without a recognizer, any file may be replaced (the option's own reader judges it).
  check_output_file("--out", dir.file("mine.txt"), {});
}

// A pipe is written as it is, never read to judge it (reading would block).
TEST(CheckOutputFile, APipeIsNotRead) {
  TempDir dir;
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0600), 0);
  check_output_file("--trace", dir.file("fifo"), {}, starts_with_ours);
}

// Through a symbolic link the file it names is replaced and the link stays (a dangling link
// creates its target); a pipe is written as it is, not replaced by a file.
TEST(WriteFileAtomic, FollowsLinksAndWritesPipesAsTheyAre) {
  TempDir dir;
  write_file_atomic(dir.file("real.jsonl"), "old\n");
  ASSERT_EQ(::symlink("real.jsonl", dir.file("link.jsonl").c_str()), 0);
  write_file_atomic(dir.file("link.jsonl"), "new\n");
  struct stat st;
  ASSERT_EQ(::lstat(dir.file("link.jsonl").c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  EXPECT_EQ(read_text_file(dir.file("real.jsonl")), "new\n");
  ASSERT_EQ(::symlink(dir.file("later.txt").c_str(), dir.file("dangling").c_str()), 0);
  write_file_atomic(dir.file("dangling"), "made\n");
  EXPECT_EQ(read_text_file(dir.file("later.txt")), "made\n");

  const std::string fifo = dir.file("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_TRUE(is_stream_file(fifo));
  EXPECT_FALSE(is_stream_file(dir.file("real.jsonl")));
  EXPECT_FALSE(is_stream_file(dir.path()));
  std::string got;
  std::thread reader([&] { got = read_text_file(fifo); });
  write_file_atomic(fifo, "through the pipe\n");
  reader.join();
  EXPECT_EQ(got, "through the pipe\n");
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

// Lines across the backward reader's blocks, a line longer than a block, empty lines, a last
// line with and without its newline, an early stop, a missing file; and the count of lines.
TEST(FileLines, ReadFromTheEndAndCounted) {
  TempDir dir;
  const std::string path = dir.file("log.txt");
  std::vector<std::string> lines;
  for (int i = 0; i < 3000; ++i) lines.push_back("line " + std::to_string(i));
  lines[1500] = std::string(200000, 'x');
  lines[10] = "";
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  for (const bool final_newline : {true, false}) {
    write_file_atomic(path, final_newline ? text : text.substr(0, text.size() - 1));
    std::vector<std::string> seen;
    std::vector<int64_t> offsets;
    for_each_line_from_end(path, [&](std::string_view line, int64_t offset) {
      seen.emplace_back(line);
      offsets.push_back(offset);
      return true;
    });
    std::reverse(seen.begin(), seen.end());
    std::reverse(offsets.begin(), offsets.end());
    EXPECT_EQ(seen, lines) << "final newline " << final_newline;
    for (size_t i = 0; i < lines.size(); ++i)
      ASSERT_EQ(text.substr(static_cast<size_t>(offsets[i]), lines[i].size()), lines[i]) << i;
    EXPECT_EQ(count_lines(path), 3000);
  }
  int visits = 0;
  for_each_line_from_end(path, [&](std::string_view line, int64_t) {
    ++visits;
    return line != "line 2998";
  });
  EXPECT_EQ(visits, 2);
  for_each_line_from_end(dir.file("absent"), [](std::string_view, int64_t) {
    ADD_FAILURE() << "a line of a missing file";
    return true;
  });
  EXPECT_EQ(count_lines(dir.file("absent")), 0);
  write_file_atomic(path, "");
  EXPECT_EQ(count_lines(path), 0);
}

// Pieces small and large (past the writer's buffer) make the file, which appears whole only at
// commit(); a writer dropped before it leaves the old file and no temporary one.
TEST(AtomicFileWriter, ReplacesTheFileAtCommitOnly) {
  TempDir dir;
  const std::string path = dir.file("out.jsonl");
  write_file_atomic(path, "old\n");
  const std::string large(3 << 20, 'x');
  {
    AtomicFileWriter file(path);
    file.write("a\n");
    file.write(large);
    file.write("b\n");
    EXPECT_EQ(read_text_file(path), "old\n");
  }  // dropped
  EXPECT_EQ(read_text_file(path), "old\n");
  const auto entries = [&] {
    return std::distance(std::filesystem::directory_iterator(dir.path()),
                         std::filesystem::directory_iterator());
  };
  EXPECT_EQ(entries(), 1) << "the temporary file was removed";
  AtomicFileWriter file(path);
  file.write("a\n");
  file.write(large);
  file.write("b\n");
  file.commit();
  EXPECT_EQ(read_text_file(path), "a\n" + large + "b\n");
  EXPECT_EQ(entries(), 1);
}

// A writer killed before its commit leaves its copy behind; the next writer of the same file
// removes it, and only it: not a live process's copy, nor a file of another name.
TEST(AtomicFileWriter, RemovesTheCopyOfAWriterThatIsGone) {
  TempDir dir;
  const std::string path = dir.file("out.jsonl");
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);  // reaped: its pid names no process now
  const std::string abandoned = fmt::format("{}.tmp.{}", path, child);
  const std::string live = fmt::format("{}.tmp.{}", path, ::getppid());
  for (const std::string& name : {abandoned, live, path + ".tmp.notes", path + ".tmp.1x"})
    write_file_atomic(name, "partial\n");
  AtomicFileWriter file(path);
  EXPECT_FALSE(path_exists(abandoned));
  EXPECT_TRUE(path_exists(live));
  EXPECT_TRUE(path_exists(path + ".tmp.notes"));
  EXPECT_TRUE(path_exists(path + ".tmp.1x"));
}

// What a failed command made is taken back: the directories it created, while empty, and
// nothing that was there before.
TEST(MakeDirs, TheOutermostCreatedIsRemovedAgainWhileEmpty) {
  TempDir dir;
  EXPECT_EQ(make_dirs_outermost(dir.file("a/b/c")), dir.file("a"));
  EXPECT_EQ(make_dirs_outermost(dir.file("a/b/c")), "");
  remove_empty_dirs(dir.file("a/b/c"), dir.file("a"));
  EXPECT_FALSE(path_exists(dir.file("a")));
  EXPECT_TRUE(path_exists(dir.path()));

  EXPECT_EQ(make_dirs_outermost(dir.file("x/y")), dir.file("x"));
  write_file_atomic(dir.file("x/mine.txt"), "kept\n");  // x is no longer empty
  remove_empty_dirs(dir.file("x/y"), dir.file("x"));
  EXPECT_FALSE(path_exists(dir.file("x/y")));
  EXPECT_TRUE(path_exists(dir.file("x/mine.txt")));
}

// A process that has exited and not been reaped (a zombie) is ending; this one, a live child
// and a stopped one are not; an ended and reaped one is gone (and no longer ending).
TEST(Processes, AnExitingProcessIsEndingALiveOneIsNot) {
  EXPECT_FALSE(process_ending(::getpid()));
  const pid_t sleeper = ::fork();
  if (sleeper == 0) {
    ::pause();
    ::_exit(0);
  }
  ASSERT_GT(sleeper, 0);
  EXPECT_FALSE(process_ending(sleeper));
  ::kill(sleeper, SIGSTOP);
  EXPECT_FALSE(process_ending(sleeper));  // stopped is not ending
  ::kill(sleeper, SIGKILL);
  // Killed and not yet reaped: ending until then, whatever moment it is caught at.
  for (int i = 0; i < 50 && !process_ending(sleeper); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(process_ending(sleeper));
  EXPECT_FALSE(process_gone(sleeper));  // a zombie still has its pid
  ::waitpid(sleeper, nullptr, 0);
  EXPECT_TRUE(process_gone(sleeper));
  EXPECT_FALSE(process_ending(sleeper));
}

}  // namespace
}  // namespace foundry
