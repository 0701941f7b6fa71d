// Deterministic token stream for the reference trainer, byte-level tokenizer (token = byte,
// plus BOS = 256 and EOS = 257; a model needs vocab_size >= 258).
// Sample `i` of step `s` is a function of (seed, s, i) only, never of ranks or layout: with a
// procedural corpus (default) it is a generated text of sentences with learnable structure
// (templated sentences over small word lists, sums, counting, copies); with a corpus file it is
// a window of the file at an offset drawn from (seed, s, i).
// Thread safety: const methods are safe to call concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/base/status.h"

namespace ckpt::trainer {

inline constexpr int32_t kBosToken = 256;
inline constexpr int32_t kEosToken = 257;
inline constexpr int64_t kMinVocab = 258;

class TokenStream {
 public:
  // Procedural corpus.
  static TokenStream procedural(uint64_t seed);
  // Windows of a file (bytes are tokens). The file must hold at least 2 bytes and at most
  // 1 GiB; it is read once into memory.
  static Result<TokenStream> from_file(uint64_t seed, const std::string& path);

  // tokens[seq] and targets[seq] (targets[t] = tokens[t + 1] of the underlying text) of
  // sample `index` of step `step`. seq must be >= 1 (and < file size for a file corpus).
  Status sample(int64_t step, int64_t index, int64_t seq, int32_t* tokens, int32_t* targets) const;
  // Samples first..first+count-1 of `step`: tokens, targets [count, seq].
  Status batch(int64_t step, int64_t first, int64_t count, int64_t seq, int32_t* tokens,
               int32_t* targets) const;

  // The procedural text of (step, index), at least `min_bytes` bytes (for tests and stats).
  std::string procedural_text(int64_t step, int64_t index, int64_t min_bytes) const;

  uint64_t seed() const { return seed_; }
  const std::string& source() const { return source_; }  // "procedural" or the file path

 private:
  uint64_t seed_ = 0;
  std::string source_ = "procedural";
  std::vector<uint8_t> file_;  // corpus file bytes (empty: procedural)
};

}  // namespace ckpt::trainer
