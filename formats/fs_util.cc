#include "formats/fs_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>
#include <vector>

#include "formats/file_io.h"

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

Status PartialDir::create() {
  CKPT_RETURN_IF_ERROR(check_target());
  if (path_exists(path_)) {
    if (!policy_.replace_stale)
      return Status::InvalidArgument("'" + path_ + "' exists (left by an interrupted run?): remove it first");
    CKPT_RETURN_IF_ERROR(remove_tree(path_));
  }
  CKPT_RETURN_IF_ERROR(make_dir(path_));
  owned_ = true;
  return Status::Ok();
}

Status PartialDir::commit(bool fsync) {
  CKPT_RETURN_IF_ERROR(check_target());
  if (fsync) CKPT_RETURN_IF_ERROR(fsync_dir(path_));
  // An allowed empty target directory is replaced: rename(2) onto an empty directory does that.
  if (::rename(path_.c_str(), target_.c_str()) != 0) return Status::FromErrno("cannot rename '" + path_ + "' to", target_, errno);
  owned_ = false;
  return fsync ? fsync_dir(parent_dir(target_)) : Status::Ok();
}

void PartialDir::remove() {
  (void)remove_tree(path_);
  owned_ = false;
}

void PartialDir::release() { owned_ = false; }

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
        in.assign(n, 0);
        if (::mincore(m, size, in.data()) == 0) {
          pages += n;
          for (unsigned char c : in) cached += c & 1;
        }
        ::munmap(m, size);
      }
    }
    ::close(fd);
  }
  return pages == 0 ? 1.0 : static_cast<double>(cached) / static_cast<double>(pages);
}

}  // namespace ckpt
