// DsUniversalSink: a TensorSink that writes each declared piece (a whole tensor) as its own
// torch.save file (formats/torch/torch_file_writer.h) of DeepSpeed's universal-checkpoint form
//   {'cat_dim': 0, 'param': <the tensor, dense, its storage "0">}
// which is what ds_to_universal.py saves as zero/<param>/{fp32,exp_avg,exp_avg_sq}.pt (its
// merge_tp_slices; stage 3's merge saves the bare tensor, and every loader of the universal form
// takes the dict: deepspeed/checkpoint/universal_checkpoint.py, stage3.load_hp_checkpoint_state).
// A file is opened at its piece's first write (temp name, rename when complete: torch_file_writer.h)
// and committed at its last, so only the files being written are open; an empty tensor's file is
// made at commit(). Paths are given per piece; their directories must exist.
// Thread safety: one thread at a time (the Executor's writer thread).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "formats/tensor/tensor_io.h"
#include "formats/torch/pickle/py_object.h"
#include "formats/torch/torch_file_writer.h"

namespace ckpt {

// The universal file's root object for a dense F32 tensor of `shape` in storage "0".
const torch::PyObj* ds_universal_root(torch::PyArena& a, const Shape& shape);

class DsUniversalSink final : public TensorSink {
 public:
  // paths[i]: the file of piece i (pieces are F32, one whole tensor each).
  DsUniversalSink(std::vector<std::string> paths, torch::TorchWriteOptions opts);
  ~DsUniversalSink() override;

  Status begin(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces, const nlohmann::json& metadata) override;
  Status write(size_t piece, const void* data, int64_t count) override;
  bool accepts_file_extents() const override { return true; }
  Status write_from_file(size_t piece, const FileExtent& src, int64_t count) override;
  Status commit() override;
  void abort() override;

 private:
  std::vector<std::string> paths_;
  torch::TorchWriteOptions opts_;
  std::vector<Shape> shapes_;
  std::vector<int64_t> numel_, done_;
  std::vector<std::unique_ptr<torch::TorchFileWriter>> open_;  // per piece, while being written
  std::vector<bool> committed_;

  Result<uint64_t> next_offset(size_t piece, int64_t count);
  Status open_piece(size_t piece);
  Status finish_piece(size_t piece);
};

// Writes one universal file of `shape` whose elements are all zero (a fresh Adam moment), in slabs.
Status write_ds_universal_zeros(const std::string& path, const Shape& shape, const torch::TorchWriteOptions& opts);

}  // namespace ckpt
