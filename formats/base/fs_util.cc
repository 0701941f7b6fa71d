#include "formats/base/fs_util.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "formats/base/file_io.h"

namespace ckpt {

ScopedFd& ScopedFd::operator=(ScopedFd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = o.release();
  }
  return *this;
}

int ScopedFd::release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

void ScopedFd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Status ScopedFd::close(const std::string& path) {
  if (fd_ < 0) return Status::Ok();
  if (::close(release()) != 0) return Status::FromErrno("close failed", path, errno);
  return Status::Ok();
}

Result<ScopedFd> open_fd(const std::string& path, int flags, const std::string& what, int mode) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  if (fd < 0) return Status::FromErrno(what, path, errno);
  return ScopedFd(fd);
}

namespace {

Status fsync_opened(const std::string& path, int flags, const char* what) {
  CKPT_ASSIGN_OR_RETURN(ScopedFd fd, open_fd(path, flags, what));
  if (::fsync(fd.get()) != 0) return Status::FromErrno("fsync failed", path, errno);
  return Status::Ok();
}

}  // namespace

Status fsync_path(const std::string& path) { return fsync_opened(path, O_RDONLY, "cannot open for fsync"); }

Status fsync_dir(const std::string& dir) { return fsync_opened(dir, O_RDONLY | O_DIRECTORY, "cannot open directory"); }

Status make_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) != 0) return Status::FromErrno("cannot create directory", path, errno);
  return Status::Ok();
}

Status remove_tree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return Status::Io("cannot remove '" + path + "': " + ec.message()).with_file(path);
  return Status::Ok();
}

bool path_exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string parent_dir(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  auto pos = p.rfind('/');
  if (pos == std::string::npos) return ".";
  if (pos == 0) return "/";
  return p.substr(0, pos);
}

std::string temp_path_for(const std::string& path) { return path + ".tmp-" + std::to_string(::getpid()); }

Status commit_temp_file(const std::string& tmp, const std::string& path, bool fsync) {
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    return Status::FromErrno("cannot rename into place", path, e);
  }
  return fsync ? fsync_dir(parent_dir(path)) : Status::Ok();
}

Status write_file(const std::string& path, const std::string& content, bool fsync) {
  CKPT_ASSIGN_OR_RETURN(ScopedFd fd, open_fd(path, O_WRONLY | O_CREAT | O_TRUNC, "cannot create"));
  Status s = pwrite_full(fd.get(), content.data(), content.size(), 0, path);
  if (s.ok() && fsync && ::fsync(fd.get()) != 0) s = Status::FromErrno("fsync failed", path, errno);
  Status c = fd.close(path);
  return s.ok() ? c : s;
}

Status write_file_atomic(const std::string& path, const std::string& content) {
  const std::string tmp = temp_path_for(path);
  Status s = write_file(tmp, content, /*fsync=*/true);
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  return commit_temp_file(tmp, path, /*fsync=*/true);
}

Status read_small_file(const std::string& path, size_t max_bytes, std::string* out) {
  CKPT_ASSIGN_OR_RETURN(ScopedFd fd, open_fd(path, O_RDONLY, "cannot open"));
  out->clear();
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno("cannot read", path, errno);
    if (n == 0) return Status::Ok();
    out->append(buf, static_cast<size_t>(n));
    if (out->size() > max_bytes)
      return Status::Error("FileTooLarge", "'" + path + "' is larger than " + std::to_string(max_bytes) + " bytes").with_file(path);
  }
}

// ---- DirLock ----

namespace {

// The directories this process holds a DirLock on: (dev, ino) -> locks granted (1 + nested).
struct HeldDirs {
  std::mutex mu;
  std::map<std::pair<uint64_t, uint64_t>, int> count;
};
HeldDirs& held_dirs() {
  static HeldDirs* h = new HeldDirs;  // never destroyed: DirLocks may outlive static destruction
  return *h;
}

// The locks PartialDir::release() handed over, by NAME.partial path (until commit() / remove()).
struct KeptLocks {
  std::mutex mu;
  std::map<std::string, DirLock> by_path;
};
KeptLocks& kept_locks() {
  static KeptLocks* k = new KeptLocks;
  return *k;
}

void keep_lock(const std::string& path, DirLock lock) {
  DirLock old;
  {
    std::lock_guard<std::mutex> g(kept_locks().mu);
    DirLock& slot = kept_locks().by_path[path];
    old = std::move(slot);
    slot = std::move(lock);
  }
}  // `old` (a lock of a previous NAME.partial of the same path) is dropped outside the mutex

void drop_kept_lock(const std::string& path) {
  DirLock old;
  {
    std::lock_guard<std::mutex> g(kept_locks().mu);
    auto it = kept_locks().by_path.find(path);
    if (it == kept_locks().by_path.end()) return;
    old = std::move(it->second);
    kept_locks().by_path.erase(it);
  }
}

Status busy(const std::string& dir, const std::string& what) {
  const int64_t pid = lock_holder_pid(dir);
  return Status::Error("DestinationBusy", what + ": '" + dir + "' is locked by another process (" +
                                              (pid > 0 ? "pid " + std::to_string(pid) : std::string("pid unknown")) +
                                              "), which is writing it now; wait for it to finish or stop it")
      .with_file(dir);
}

}  // namespace

DirLock::DirLock(DirLock&& o) noexcept
    : fd_(std::move(o.fd_)), dev_(o.dev_), ino_(o.ino_), held_(std::exchange(o.held_, false)) {}

DirLock& DirLock::operator=(DirLock&& o) noexcept {
  if (this != &o) {
    unlock();
    fd_ = std::move(o.fd_);
    dev_ = o.dev_;
    ino_ = o.ino_;
    held_ = std::exchange(o.held_, false);
  }
  return *this;
}

void DirLock::unlock() {
  if (!held_) return;
  held_ = false;
  std::lock_guard<std::mutex> g(held_dirs().mu);
  auto it = held_dirs().count.find({dev_, ino_});
  if (it != held_dirs().count.end() && --it->second <= 0) held_dirs().count.erase(it);
  fd_.reset();  // closing the last fd of the open file description drops the flock
}

Result<DirLock> DirLock::try_lock(const std::string& dir, const std::string& what) { return lock(dir, what, 0); }

Result<DirLock> DirLock::lock(const std::string& dir, const std::string& what, double wait_s) {
  DirLock l;
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno("cannot open directory to lock it", dir, errno);
  l.fd_ = ScopedFd(fd);
  struct stat sb {};
  if (::fstat(fd, &sb) != 0) return Status::FromErrno("cannot stat", dir, errno);
  l.dev_ = static_cast<uint64_t>(sb.st_dev);
  l.ino_ = static_cast<uint64_t>(sb.st_ino);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  for (;;) {
    {
      std::lock_guard<std::mutex> g(held_dirs().mu);
      auto it = held_dirs().count.find({l.dev_, l.ino_});
      if (it != held_dirs().count.end()) {  // this process holds it: a nested lock
        ++it->second;
        l.fd_.reset();
        l.held_ = true;
        return l;
      }
      if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
        held_dirs().count[{l.dev_, l.ino_}] = 1;
        l.held_ = true;
        return l;
      }
      if (errno != EWOULDBLOCK && errno != EINTR) return Status::FromErrno("cannot lock directory", dir, errno);
    }
    if (std::chrono::steady_clock::now() >= deadline) return busy(dir, what);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

int64_t lock_holder_pid(const std::string& path) {
  struct stat sb {};
  if (::stat(path.c_str(), &sb) != 0) return -1;
  std::ifstream in("/proc/locks");
  std::string line;
  int64_t by_inode = -1;
  while (std::getline(in, line)) {
    // "1: FLOCK  ADVISORY  WRITE 1234 fe:00:2146658 0 EOF"; a waiter's line has "->" after the id.
    std::istringstream ls(line);
    std::string id, type, mode, rw, dev_ino;
    int64_t pid = -1;
    if (!(ls >> id >> type)) continue;
    if (type == "->") continue;
    if (!(ls >> mode >> rw >> pid >> dev_ino)) continue;
    unsigned maj = 0, mnr = 0;
    unsigned long long ino = 0;
    if (std::sscanf(dev_ino.c_str(), "%x:%x:%llu", &maj, &mnr, &ino) != 3) continue;
    if (ino != static_cast<unsigned long long>(sb.st_ino)) continue;
    if (maj == major(sb.st_dev) && mnr == minor(sb.st_dev)) return pid;
    if (by_inode < 0) by_inode = pid;  // overlay file systems may report another device
  }
  return by_inode;
}

// ---- PartialDir ----

PartialDir::PartialDir(std::string target, PartialDirPolicy policy) : policy_(policy) {
  while (target.size() > 1 && target.back() == '/') target.pop_back();
  target_ = std::move(target);
  path_ = target_ + ".partial";
}

PartialDir::~PartialDir() {
  if (owned_) remove();
}

std::string PartialDir::path_for(const std::string& target) { return PartialDir(target).path(); }

namespace {

bool is_empty_directory(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec) && std::filesystem::is_empty(path, ec) && !ec;
}

}  // namespace

Status PartialDir::check_target() const {
  if (!path_exists(target_)) return Status::Ok();
  if (!policy_.empty_target_ok) return Status::InvalidArgument("destination '" + target_ + "' already exists").with_file(target_);
  if (is_empty_directory(target_)) return Status::Ok();
  return Status::InvalidArgument("output '" + target_ + "' already exists and is not an empty directory");
}

namespace {

// The lock on `target`'s parent directory, held while a NAME.partial is checked, removed or made
// (waiting a little for another creator is fine). An empty DirLock where the parent cannot be
// opened (no read permission): the caller goes on unlocked.
Result<DirLock> lock_parent(const std::string& target, const std::string& what) {
  constexpr double kParentWaitS = 10;
  if (!is_directory(parent_dir(target))) return DirLock();
  auto p = DirLock::lock(parent_dir(target), what + " (its parent directory)", kParentWaitS);
  if (p.ok() || p.status().code() == "DestinationBusy") return p;
  return DirLock();
}

// A NAME.partial directory that a live writer holds is refused (DestinationBusy); a crashed one's
// leftover is not locked by anybody.
Status refuse_live_writer(const std::string& partial, const std::string& what) {
  if (!is_directory(partial)) return Status::Ok();
  return DirLock::try_lock(partial, what + " is being written by another ckpt process").status();
}

}  // namespace

Status PartialDir::create() {
  const std::string what = "destination '" + target_ + "'";
  CKPT_ASSIGN_OR_RETURN(DirLock parent, lock_parent(target_, what));
  CKPT_RETURN_IF_ERROR(check_target());
  if (path_exists(path_)) {
    CKPT_RETURN_IF_ERROR(refuse_live_writer(path_, what));  // else a crashed writer's leftover
    if (!policy_.replace_stale)
      return Status::InvalidArgument("'" + path_ + "' exists (left by an interrupted run?): remove it first");
    CKPT_RETURN_IF_ERROR(remove_tree(path_));
  }
  CKPT_RETURN_IF_ERROR(make_dir(path_));
  auto l = DirLock::try_lock(path_, what + " is being written by another ckpt process");
  if (!l.ok()) {
    (void)remove_tree(path_);
    return l.take_status();
  }
  lock_ = std::move(l).value();
  owned_ = true;
  return Status::Ok();
}

Status remove_stale_partial(const std::string& target_in) {
  PartialDir probe(target_in);
  const std::string& path = probe.path();
  if (!path_exists(path)) return Status::Ok();
  const std::string what = "destination '" + probe.target() + "'";
  CKPT_ASSIGN_OR_RETURN(DirLock parent, lock_parent(probe.target(), what));
  CKPT_RETURN_IF_ERROR(refuse_live_writer(path, what));
  return remove_tree(path);
}

namespace {

// Test hook: CKPT_TEST_HOLD_BEFORE_COMMIT_S=<seconds> holds every commit that long (a writer
// still at work, for the tests of a second writer and of a killed one).
void test_hold_before_commit() {
  const char* v = std::getenv("CKPT_TEST_HOLD_BEFORE_COMMIT_S");
  if (!v || !*v) return;
  const double s = std::atof(v);
  if (s > 0 && s < 3600) std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

}  // namespace

Status PartialDir::commit(bool fsync) {
  test_hold_before_commit();
  CKPT_RETURN_IF_ERROR(check_target());
  if (fsync) CKPT_RETURN_IF_ERROR(fsync_dir(path_));
  // An allowed empty target directory is replaced: rename(2) onto an empty directory does that.
  if (::rename(path_.c_str(), target_.c_str()) != 0) return Status::FromErrno("cannot rename '" + path_ + "' to", target_, errno);
  owned_ = false;
  Status st = fsync ? fsync_dir(parent_dir(target_)) : Status::Ok();
  lock_.unlock();  // held across the rename: the fd names the directory, now NAME
  drop_kept_lock(path_);
  return st;
}

void PartialDir::remove() {
  (void)remove_tree(path_);
  owned_ = false;
  lock_.unlock();
  drop_kept_lock(path_);
}

void PartialDir::release() {
  owned_ = false;
  if (lock_.held()) keep_lock(path_, std::move(lock_));
}

constexpr uint64_t kSharePages = 64, kShareSpans = 64;  // pages per span, spans per large file

double page_cache_share(const std::string& path) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  uint64_t pages = 0, cached = 0;
  std::error_code ec;
  std::vector<std::string> files;
  if (std::filesystem::is_regular_file(path, ec)) files.push_back(path);
  for (auto it = std::filesystem::recursive_directory_iterator(path, ec); !ec && it != std::filesystem::recursive_directory_iterator();
       it.increment(ec))
    if (it->is_regular_file(ec) && !it->is_symlink(ec)) files.push_back(it->path().string());
  std::vector<unsigned char> in;
  for (const std::string& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat sb {};
    if (::fstat(fd, &sb) == 0 && sb.st_size > 0) {
      const uint64_t size = static_cast<uint64_t>(sb.st_size), n = (size + page - 1) / page;
      void* m = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
      if (m != MAP_FAILED) {
        // Large files: kShareSpans spans, evenly spaced, stand for the file (every page of 3 GB: 55 ms)
        const bool whole = n <= kShareSpans * kSharePages;
        const uint64_t span = std::min<uint64_t>(n, kSharePages), spans = whole ? (n + span - 1) / span : kShareSpans;
        uint64_t seen = 0, hit = 0;
        for (uint64_t k = 0; k < spans; ++k) {
          const uint64_t first = whole ? k * span : k * (n - span) / (spans - 1), len = std::min(span, n - first);
          in.assign(len, 0);
          if (::mincore(static_cast<char*>(m) + first * page, len * page, in.data()) != 0) continue;
          seen += len;
          for (unsigned char c : in) hit += c & 1;
        }
        if (seen > 0) {
          pages += n;
          cached += static_cast<uint64_t>(static_cast<double>(n) * static_cast<double>(hit) / static_cast<double>(seen));
        }
        ::munmap(m, size);
      }
    }
    ::close(fd);
  }
  return pages == 0 ? 1.0 : static_cast<double>(cached) / static_cast<double>(pages);
}

}  // namespace ckpt
