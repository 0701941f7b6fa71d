// POSIX file-system helpers of the commit protocol, shared by ckpt's writers (native store, run
// dir `latest`, safetensors file and directory): a scoped file descriptor, fsync of files and
// directories, atomic replace of a file (temp name, fsync, rename, fsync of the directory), and
// PartialDir, a directory built as `NAME.partial/` and renamed to `NAME` when complete.
// Errors are ckpt::Status naming the path. Thread safety: functions are stateless; one thread
// per ScopedFd / PartialDir.
#pragma once

#include <cstddef>
#include <string>

#include "formats/base/status.h"

namespace ckpt {

// Owns a file descriptor: closed on destruction (errors ignored) or by close() (errors reported).
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() { reset(); }
  ScopedFd(ScopedFd&& o) noexcept : fd_(o.release()) {}
  ScopedFd& operator=(ScopedFd&& o) noexcept;
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  void reset();                           // closes, ignoring errors
  Status close(const std::string& path);  // closes; "close failed" naming `path`

 private:
  int fd_ = -1;
};

// open(2) with O_CLOEXEC; on failure an error "<what> '<path>': <strerror>".
Result<ScopedFd> open_fd(const std::string& path, int flags, const std::string& what, int mode = 0644);

Status fsync_path(const std::string& path);  // a file or a directory
Status fsync_dir(const std::string& dir);    // a directory (O_DIRECTORY)
Status make_dir(const std::string& path);    // mkdir, fails if it exists
Status remove_tree(const std::string& path);  // rm -rf; OK if missing
bool path_exists(const std::string& path);   // lstat: a dangling symlink exists
bool is_directory(const std::string& path);
// The share (0..1) of the bytes of `path` (a regular file, or the regular files under a directory,
// recursively, symlinks not followed) that are in the page cache (mincore of a mapping that
// touches no page; in files of more than 16 MiB, of 64 evenly spaced spans of 256 KiB, standing for
// the file); 1 when there are none or `path` cannot be read. How `--io auto` tells a warm source
// from a cold one.
double page_cache_share(const std::string& path);
std::string parent_dir(const std::string& path);  // "." for a bare name

// "<path>.tmp-<pid>": where a file is written before it is renamed to `path`.
std::string temp_path_for(const std::string& path);
// Renames the complete file `tmp` to `path` (removing `tmp` if that fails), then fsyncs the
// directory of `path` when `fsync`.
Status commit_temp_file(const std::string& tmp, const std::string& path, bool fsync);
// Writes `content` to `temp_path_for(path)`, fsync, rename to `path`, fsync of the directory.
Status write_file_atomic(const std::string& path, const std::string& content);
// Creates (or truncates) `path` and writes `content`, fsynced when `fsync`; no rename: for files
// inside a PartialDir, which is renamed as a whole.
Status write_file(const std::string& path, const std::string& content, bool fsync);
// Reads a small file (at most `max_bytes`; more is a kCorruption "FileTooLarge" error).
Status read_small_file(const std::string& path, size_t max_bytes, std::string* out);

// An exclusive flock(2) on a directory, held while the object lives. The kernel drops it when the
// process dies (a crashed writer's leftover is then free to clean up) and it follows the directory
// through rename(2) (the fd names the inode). Within one process a lock of a directory the process
// already holds is granted as a nested lock that owns nothing (a trainer holds its run dir and
// creates checkpoints in it); across processes it is a kInvalidArgument "DestinationBusy" naming
// `what`, the directory and the holder's pid. Thread safe (a process-wide table of held dirs).
class DirLock {
 public:
  DirLock() = default;
  ~DirLock() { unlock(); }
  DirLock(DirLock&& o) noexcept;
  DirLock& operator=(DirLock&& o) noexcept;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

  // Refused at once when another process holds the lock.
  static Result<DirLock> try_lock(const std::string& dir, const std::string& what);
  // Waits up to `wait_s` seconds for another process's lock: for locks held only briefly.
  static Result<DirLock> lock(const std::string& dir, const std::string& what, double wait_s);

  bool held() const { return held_; }
  void unlock();

 private:
  ScopedFd fd_;  // invalid for a nested lock
  uint64_t dev_ = 0, ino_ = 0;
  bool held_ = false;
};

// The pid of a process holding a flock(2) on `path` (from /proc/locks), or -1 if none is found.
int64_t lock_holder_pid(const std::string& path);

// Removes `<target>.partial` left by a crashed writer (a directory no live process holds locked,
// checked under the parent's lock as PartialDir::create does); one a live writer holds is
// "DestinationBusy". OK when there is none.
Status remove_stale_partial(const std::string& target);

struct PartialDirPolicy {
  bool replace_stale = false;    // a leftover NAME.partial is removed (else create() refuses it)
  bool empty_target_ok = false;  // NAME may be an existing empty directory, replaced at commit
};

// An output directory NAME built under NAME.partial: create() refuses an existing NAME (as the
// policy says) and makes NAME.partial; the writer fills it; commit() fsyncs it, renames it to
// NAME and fsyncs the parent. A PartialDir whose create() succeeded removes NAME.partial on
// destruction unless commit() succeeded or release() was called (another process or object
// finishes it: multi-rank writers create on rank 0 and commit from a second PartialDir).
// Locking: create() holds a DirLock on NAME's parent while it checks, removes a stale leftover
// and makes NAME.partial (so two creators never both see "stale"), then a DirLock on NAME.partial
// itself until commit() or remove(); after release() the process keeps that lock until a
// PartialDir of the same NAME commits or removes it (or the process ends). A NAME.partial whose
// lock another live process holds is that process's output in progress: create() refuses it at
// once ("DestinationBusy", naming NAME and the holder's pid); one nobody holds is a crashed
// writer's leftover, replaced as the policy says.
class PartialDir {
 public:
  explicit PartialDir(std::string target, PartialDirPolicy policy = {});
  ~PartialDir();
  PartialDir(const PartialDir&) = delete;
  PartialDir& operator=(const PartialDir&) = delete;

  static std::string path_for(const std::string& target);  // "<target>.partial" (no trailing '/')
  const std::string& target() const { return target_; }
  const std::string& path() const { return path_; }

  Status check_target() const;  // kInvalidArgument if NAME exists (and is not allowed to)
  Status create();
  Status commit(bool fsync);
  void remove();   // rm -rf NAME.partial now (abort)
  void release();  // leave NAME.partial on destruction

 private:
  std::string target_, path_;
  PartialDirPolicy policy_;
  bool owned_ = false;  // create() made NAME.partial and nothing has committed or released it
  DirLock lock_;        // on NAME.partial, from create() to commit() / remove() / release()
};

}  // namespace ckpt
