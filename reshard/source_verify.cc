#include "reshard/source_verify.h"

#include "formats/base/thread_pool.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <tuple>
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
[[noreturn]] void child_main(int fd, pid_t parent, const std::function<Status()>& check) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(0);  // the parent died before prctl took effect
  const Status st = check();
  write_all(fd, st.to_json());
  _exit(0);
}

}  // namespace

Status verdict(const CheckReport& rep) {
  if (rep.ok()) return Status::Ok();
  const CheckFailure& f = rep.failures.front();
  Status st = f.status;
  const std::string which = f.piece != CheckFailure::kNoPiece ? "SRC piece " + std::to_string(f.piece) : "SRC";
  return std::move(st).with_context(which + " is corrupt (" + std::to_string(rep.failures.size()) +
                                    " failing units); nothing was committed");
}

Status verify_source_inline(store::StoreReader& src) { return verdict(src.verify()); }

bool copy_verifiable(const store::Manifest& m) {
  return std::all_of(m.pieces.begin(), m.pieces.end(), [](const store::PieceRecord& rec) { return rec.codec == store::Codec::kNone; });
}

CopyVerify::CopyVerify(TensorSource& src) : src_(src), piece_range_(src.pieces().size(), -1) {
  std::map<std::tuple<uint64_t, uint64_t, uint64_t, uint64_t>, size_t> seen;  // (dev, ino, off, bytes) -> hashed_
  for (size_t i = 0; i < src.pieces().size(); ++i) {
    const std::optional<RangeCheck> rc = src.range_check(i);
    struct stat sb {};
    if (!rc || rc->extent.bytes == 0 || ::fstat(rc->extent.fd, &sb) != 0) continue;  // checked by finish() alone
    const auto key = std::make_tuple(static_cast<uint64_t>(sb.st_dev), static_cast<uint64_t>(sb.st_ino), rc->extent.offset, rc->extent.bytes);
    auto [it, fresh] = seen.emplace(key, hashed_.size());
    if (fresh) {
      auto h = std::make_unique<Hashed>();
      std::tie(h->dev, h->ino, h->off, h->bytes) = key;
      h->want = rc->digest.hex;
      h->digest = Digest(rc->digest.algo);
      hashed_.push_back(std::move(h));
    } else if (hashed_[it->second]->want != rc->digest.hex) {
      continue;  // one range, two digests (a crafted source): checked by finish() alone
    }
    piece_range_[i] = static_cast<int64_t>(it->second);
  }
}

std::vector<BlockTap::Range> CopyVerify::ranges(uint64_t dev, uint64_t ino) {
  std::vector<Range> out;
  uint64_t last_end = 0;
  std::vector<size_t> mine;
  for (size_t k = 0; k < hashed_.size(); ++k)
    if (hashed_[k]->dev == dev && hashed_[k]->ino == ino) mine.push_back(k);
  std::sort(mine.begin(), mine.end(), [this](size_t a, size_t b) { return hashed_[a]->off < hashed_[b]->off; });
  for (size_t k : mine) {  // ranges must not overlap: one that would (a crafted file) is left to finish()
    if (!out.empty() && hashed_[k]->off < last_end) continue;
    out.push_back({k, hashed_[k]->off, hashed_[k]->bytes});
    last_end = hashed_[k]->off + hashed_[k]->bytes;
  }
  return out;
}

void CopyVerify::feed(uint64_t id, uint64_t off, const char* p, uint64_t n) {
  Hashed& h = *hashed_.at(id);
  std::lock_guard<std::mutex> l(h.mu);
  if (off != h.off + h.fed || n > h.bytes - h.fed) return;  // not the next bytes: never whole, re-read
  h.digest.update(p, n);
  h.fed += n;
  if (h.fed == h.bytes) h.hex = h.digest.hex_digest();
}

Status CopyVerify::finish() {
  std::vector<bool> good(hashed_.size(), false);
  from_copy_ = reread_ = 0;
  for (size_t k = 0; k < hashed_.size(); ++k) {
    Hashed& h = *hashed_[k];
    std::lock_guard<std::mutex> l(h.mu);
    good[k] = h.fed == h.bytes && h.hex == h.want;
    if (good[k]) from_copy_ += h.bytes;
  }
  // The others, each checked its format's way (once per unit: check_piece remembers).
  CheckReport rep;
  for (size_t i = 0; i < piece_range_.size(); ++i) {
    if (piece_range_[i] >= 0 && good[static_cast<size_t>(piece_range_[i])]) continue;
    const Piece& p = src_.pieces()[i];
    reread_ += static_cast<uint64_t>(p.region.numel()) * dtype_size(p.dtype);
    Status st = src_.check_piece(i);
    ++rep.pieces;
    if (!st.ok()) {
      const std::string file = st.file();
      rep.failures.push_back({i, std::move(st), p.tensor, file, ""});
    }
  }
  return verdict(rep);
}

BackgroundVerify::~BackgroundVerify() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (fd_ >= 0) close(fd_);
}

bool BackgroundVerify::start(const std::string& src_dir, IoMode io) {
  return start([src_dir, io]() -> Status {
    auto r = store::StoreReader::open(src_dir);
    if (!r.ok()) return r.take_status();
    (*r)->set_read_io(io);
    return verify_source_inline(**r);
  });
}

bool BackgroundVerify::start(const std::function<Status()>& check) {
  // A fork copies only the calling thread: a lock another thread held at that moment (malloc's
  // under clang-14's ASan, HDF5's, one of ours) stays locked in the child forever. While a pool of
  // ours has workers the check runs inline instead (the caller's fallback), never in a child that
  // may hang. (OpenBLAS's threads, parked since the library loaded, hold no lock.)
  if (ThreadPool::live_workers() > 0) return false;
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
    child_main(p[1], parent, check);
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
