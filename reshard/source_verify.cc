#include "reshard/source_verify.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

namespace ckpt {

namespace {

// The child's verdict is one Status as JSON; anything longer is cut (and then refused by from_json).
constexpr size_t kMaxVerdictBytes = size_t{1} << 20;

void write_all(int fd, const std::string& text) {
  size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

// Runs in the child: never returns.
[[noreturn]] void child_main(int fd, pid_t parent, const std::string& src_dir, IoMode io) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(0);  // the parent died before prctl took effect
  Status st;
  auto r = store::StoreReader::open(src_dir);
  if (!r.ok()) {
    st = r.take_status();
  } else {
    (*r)->set_read_io(io);
    st = verify_source_inline(**r);
  }
  write_all(fd, st.to_json());
  _exit(0);
}

}  // namespace

Status verify_source_inline(store::StoreReader& src) {
  store::VerifyReport rep = src.verify();
  if (rep.ok()) return Status::Ok();
  return std::move(rep.failures.front().status)
      .with_context("SRC piece " + std::to_string(rep.failures.front().piece) + " is corrupt (" +
                    std::to_string(rep.failures.size()) + " failing pieces); nothing was committed");
}

BackgroundVerify::~BackgroundVerify() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (fd_ >= 0) close(fd_);
}

bool BackgroundVerify::start(const std::string& src_dir, IoMode io) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return false;
  std::fflush(nullptr);
  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ < 0) {
    close(p[0]);
    close(p[1]);
    return false;
  }
  if (pid_ == 0) {
    close(p[0]);
    child_main(p[1], parent, src_dir, io);
  }
  close(p[1]);
  fd_ = p[0];
  return true;
}

Status BackgroundVerify::wait() {
  std::string text;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (text.size() < kMaxVerdictBytes) text.append(buf, static_cast<size_t>(n));
  }
  close(fd_);
  fd_ = -1;
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || text.empty())
    return Status::Internal("the SRC verification process failed (status " + std::to_string(status) +
                            "); nothing was committed");
  return Status::from_json(text);
}

}  // namespace ckpt
