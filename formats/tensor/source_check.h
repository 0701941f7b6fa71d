// What a checkpoint can check of its own bytes, and the outcome of a check (TensorSource::
// integrity / check / check_piece in formats/tensor/tensor_io.h).
//  - IntegrityInfo: the format by name, the scheme that guards its bytes ("xxh3-128 piece
//    digests", "zip CRC-32", ...; empty when the format has none) and, by format name, what it
//    cannot check ("safetensors has no checksums").
//  - CheckReport: units checked (pieces, zip entries, items), bytes, and every failure naming the
//    file, the tensor and the unit.
// A unit is what the format guards as one: a native store piece, a torch zip entry, a DCP item.
// Thread safety: plain values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "formats/base/io_mode.h"
#include "formats/base/status.h"

namespace ckpt {

struct IntegrityInfo {
  std::string format = {};        // "ckpt-native v3", "safetensors", "Megatron-LM torch files", ...
  std::string scheme = {};        // what guards the bytes; empty: nothing (bytes read, not checkable)
  std::string cannot_check = {};  // what the format cannot check, by format name; empty when nothing
  std::vector<std::string> digests = {};  // algorithms of the digests ("xxh3-128"), where the scheme has them
  bool checks() const { return !scheme.empty(); }
};

struct CheckFailure {
  static constexpr size_t kNoPiece = static_cast<size_t>(-1);
  size_t piece = kNoPiece;  // index into the checked source's pieces() when one piece is meant
  Status status;            // what differs: names file, tensor, expected vs got
  std::string tensor, file, unit;  // unit: dataset, zip entry or item, when known
};

struct CheckReport {
  uint64_t pieces = 0, bytes = 0;  // units checked and their bytes
  std::vector<CheckFailure> failures;
  bool ok() const { return failures.empty(); }
  // OK, or the first failure saying how many units fail (`what`: "SRC", "the checkpoint").
  Status verdict(const std::string& what) const;
};

struct CheckOptions {
  int threads = 2;
  std::function<void(uint64_t, uint64_t)> progress;  // (done bytes, total bytes) on the calling thread
  IoMode io = IoMode::kBuffered;                      // how file ranges are read for hashing
  int share = 0, shares = 1;  // check only the units of this share (a distributed check): unit i when i % shares == share
};

}  // namespace ckpt
