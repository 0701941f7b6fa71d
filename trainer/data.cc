#include "trainer/data.h"

#include <cerrno>
#include <cstdio>
#include <sys/stat.h>

#include "trainer/model/init.h"

namespace ckpt::trainer {

namespace {

constexpr uint64_t kMaxCorpusBytes = uint64_t{1} << 30;

// A counter-based stream keyed by (seed, step, index).
class Rng {
 public:
  Rng(uint64_t seed, int64_t step, int64_t index) {
    key_ = splitmix64(splitmix64(seed ^ 0x5EED5EED5EED5EEDull) ^ static_cast<uint64_t>(step));
    key_ = splitmix64(key_ ^ (static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull));
  }
  uint64_t next() { return splitmix64(key_ + ctr_++); }
  int below(int n) { return static_cast<int>(next() % static_cast<uint64_t>(n)); }

 private:
  uint64_t key_;
  uint64_t ctr_ = 0;
};

const char* const kAdj[] = {"red", "small", "quiet", "bright", "old", "green", "happy", "cold",
                            "soft", "brave", "tall", "round", "dark", "swift", "calm", "young"};
const char* const kNoun[] = {"cat", "dog", "bird", "tree", "river", "stone", "child", "ship",
                             "house", "garden", "horse", "lamp", "cloud", "robot", "apple", "king"};
const char* const kVerb[] = {"sees", "likes", "finds", "moves", "holds", "follows", "paints",
                             "builds", "watches", "carries", "calls", "helps"};
const char* const kPlace[] = {"near the sea", "in the forest", "on the hill", "at the market",
                              "under the bridge", "by the old wall"};

template <size_t N>
const char* pick(Rng& r, const char* const (&a)[N]) { return a[r.below(static_cast<int>(N))]; }

void sentence(Rng& r, std::string& out) {
  switch (r.below(6)) {
    case 0:
    case 1:  // the <adj> <noun> <verb> the <noun> [place].
      out += "the ";
      out += pick(r, kAdj);
      out += ' ';
      out += pick(r, kNoun);
      out += ' ';
      out += pick(r, kVerb);
      out += " the ";
      out += pick(r, kNoun);
      if (r.below(2)) {
        out += ' ';
        out += pick(r, kPlace);
      }
      out += ". ";
      break;
    case 2: {  // sums of small numbers
      const int a = r.below(50), b = r.below(50);
      out += std::to_string(a) + " plus " + std::to_string(b) + " is " + std::to_string(a + b) + ". ";
      break;
    }
    case 3: {  // counting
      int a = r.below(90);
      const int n = 3 + r.below(5);
      out += "count";
      for (int i = 0; i < n; ++i) out += ' ' + std::to_string(a + i);
      out += ". ";
      break;
    }
    case 4: {  // copy a random word (induction)
      std::string w;
      const int n = 3 + r.below(4);
      for (int i = 0; i < n; ++i) w += static_cast<char>('a' + r.below(26));
      out += "say " + w + " again: " + w + ". ";
      break;
    }
    default: {  // a noun and its plural
      const char* n = pick(r, kNoun);
      out += std::string("one ") + n + ", two " + n + "s. ";
      break;
    }
  }
  if (r.below(8) == 0) out += '\n';
}

}  // namespace

TokenStream TokenStream::procedural(uint64_t seed) {
  TokenStream t;
  t.seed_ = seed;
  return t;
}

Result<TokenStream> TokenStream::from_file(uint64_t seed, const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return Status::FromErrno("cannot open corpus", path, errno);
  struct stat st;
  if (fstat(fileno(f), &st) != 0) {
    const int e = errno;
    std::fclose(f);
    return Status::FromErrno("cannot stat corpus", path, e);
  }
  if (st.st_size < 2 || static_cast<uint64_t>(st.st_size) > kMaxCorpusBytes) {
    std::fclose(f);
    return Status::InvalidArgument("corpus '" + path + "': size " + std::to_string(st.st_size) +
                                   " bytes, expected 2 .. " + std::to_string(kMaxCorpusBytes));
  }
  TokenStream t;
  t.seed_ = seed;
  t.source_ = path;
  t.file_.resize(static_cast<size_t>(st.st_size));
  const size_t got = std::fread(t.file_.data(), 1, t.file_.size(), f);
  std::fclose(f);
  if (got != t.file_.size())
    return Status::Io("corpus '" + path + "': read " + std::to_string(got) + " of " +
                      std::to_string(t.file_.size()) + " bytes");
  return t;
}

std::string TokenStream::procedural_text(int64_t step, int64_t index, int64_t min_bytes) const {
  Rng r(seed_, step, index);
  std::string out;
  while (static_cast<int64_t>(out.size()) < min_bytes) sentence(r, out);
  return out;
}

Status TokenStream::sample(int64_t step, int64_t index, int64_t seq, int32_t* tokens,
                           int32_t* targets) const {
  if (seq < 1) return Status::InvalidArgument("sequence length must be >= 1");
  if (file_.empty()) {
    // BOS + text: seq + 1 tokens.
    const std::string text = procedural_text(step, index, seq);
    tokens[0] = kBosToken;
    for (int64_t t = 1; t < seq; ++t) tokens[t] = static_cast<uint8_t>(text[static_cast<size_t>(t - 1)]);
    for (int64_t t = 0; t < seq; ++t) targets[t] = static_cast<uint8_t>(text[static_cast<size_t>(t)]);
    return Status::Ok();
  }
  const uint64_t size = file_.size();
  if (static_cast<uint64_t>(seq) + 1 > size)
    return Status::InvalidArgument("corpus '" + source_ + "' has " + std::to_string(size) +
                                   " bytes, fewer than seq + 1 = " + std::to_string(seq + 1));
  Rng r(seed_, step, index);
  const uint64_t off = r.next() % (size - static_cast<uint64_t>(seq));
  for (int64_t t = 0; t < seq; ++t) {
    tokens[t] = file_[off + static_cast<uint64_t>(t)];
    targets[t] = file_[off + static_cast<uint64_t>(t) + 1];
  }
  return Status::Ok();
}

Status TokenStream::batch(int64_t step, int64_t first, int64_t count, int64_t seq, int32_t* tokens,
                          int32_t* targets) const {
  for (int64_t i = 0; i < count; ++i)
    CKPT_RETURN_IF_ERROR(sample(step, first + i, seq, tokens + i * seq, targets + i * seq));
  return Status::Ok();
}

}  // namespace ckpt::trainer
