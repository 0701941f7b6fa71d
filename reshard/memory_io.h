// In-memory TensorSource and TensorSink: a checkpoint held as one byte buffer per piece (piece
// bytes in storage order: row-major over the box, or the flat range of it). Used by tests (round
// trips through the executor); the trainer keeps its own buffers and does not use these (yet).
// Thread safety: one thread at a time per object.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/tensor/tensor_io.h"

namespace ckpt {

struct MemoryCheckpoint {
  std::vector<TensorMeta> tensors;
  std::vector<Piece> pieces;
  std::vector<std::vector<uint8_t>> data;  // data[i]: bytes of pieces[i], storage order
  nlohmann::json metadata = nlohmann::json::object();
};

class MemorySource : public TensorSource {
 public:
  // Checks that every buffer has its piece's byte size (kCorruption "PieceSize" otherwise) on read.
  explicit MemorySource(MemoryCheckpoint ckpt, std::string name = "memory")
      : c_(std::move(ckpt)), name_(std::move(name)) {}
  const std::vector<TensorMeta>& tensors() const override { return c_.tensors; }
  const std::vector<Piece>& pieces() const override { return c_.pieces; }
  Status read(size_t piece, const Box& sub, void* dst) override;
  const nlohmann::json& metadata() const override { return c_.metadata; }
  std::string describe() const override { return name_; }
  const MemoryCheckpoint& checkpoint() const { return c_; }
  uint64_t reads() const { return reads_; }  // number of read() calls (tests)

 private:
  MemoryCheckpoint c_;
  std::string name_;
  uint64_t reads_ = 0;
};

class MemorySink : public TensorSink {
 public:
  Status begin(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces,
               const nlohmann::json& metadata) override;
  Status write(size_t piece, const void* data, int64_t count) override;
  Status commit() override;  // fails unless every piece was written completely
  void abort() override;
  bool committed() const { return committed_; }
  bool aborted() const { return aborted_; }
  bool began() const { return began_; }
  const MemoryCheckpoint& checkpoint() const { return c_; }
  MemoryCheckpoint take() { return std::move(c_); }

 private:
  MemoryCheckpoint c_;
  std::vector<int64_t> written_;  // elements written per piece
  bool began_ = false, committed_ = false, aborted_ = false;
};

}  // namespace ckpt
