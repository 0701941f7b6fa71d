// TorchFileSink: a TensorSink that writes one torch.save file (formats/torch/torch_file_writer.h)
// whose pickle the caller built (e.g. a Megatron-LM `model_optim_rng.pt` with its nested state
// dict, args Namespace, RNG state): each declared piece fills a range of one storage, given by
// `slots` (storage index and first element), in the piece's element order. Several pieces may
// fill one storage (a distributed optimizer's flat buffer), in any order; commit() checks every
// storage byte was written exactly once. Output: temp name, fsync, rename at commit.
// Thread safety: one thread at a time.
#pragma once

#include <string>
#include <vector>

#include "formats/tensor/tensor_io.h"
#include "formats/torch/torch_file_writer.h"

namespace ckpt::torch {

struct TorchSinkSlot {
  size_t storage = 0;        // index into the storages given to the sink
  int64_t first_element = 0;  // where the piece's first element goes in that storage
};

class TorchFileSink final : public TensorSink {
 public:
  // `root` (with its arena) must stay valid until begin() returns (the pickle is made there).
  TorchFileSink(std::string path, const PyObj* root, std::vector<TorchStorage> storages, std::vector<TorchSinkSlot> slots,
                TorchWriteOptions opts = {});

  // `metadata` is ignored. Checks each piece against its slot: same dtype, inside the storage.
  Status begin(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces, const nlohmann::json& metadata) override;
  Status write(size_t piece, const void* data, int64_t count) override;
  bool accepts_file_extents() const override { return true; }
  Status write_from_file(size_t piece, const FileExtent& src, int64_t count) override;
  std::vector<size_t> write_order() const override;  // by file offset
  Status commit() override;
  void abort() override { writer_.abort(); }

 private:
  TorchFileWriter writer_;
  const PyObj* root_;
  std::vector<TorchStorage> storages_;
  std::vector<TorchSinkSlot> slots_;
  std::vector<int64_t> done_;   // elements written per piece
  std::vector<int64_t> numel_;  // per piece
  std::vector<size_t> elem_;    // element size per piece

  Result<uint64_t> next_offset(size_t piece, int64_t count);
};

}  // namespace ckpt::torch
