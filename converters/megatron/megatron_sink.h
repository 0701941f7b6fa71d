// MegatronSink: a TensorSink that writes a Megatron-LM per-rank directory, the mirror of
// MegatronDirSource. Its pieces are the segments of the segment map (converters/megatron/megatron_segments.h)
// as boxes of canonical tensors, so the engine (reshard/executor.h) fills them from any source by
// box intersection; each segment lands at its row offset in its Megatron tensor, and the sink
// writes the vocab padding rows itself. Output: `<dst>.partial/mp_rank_XX[_YYY]/model.safetensors`
// plus megatron_args.json, committed by the safetensors directory writer (fsync, rename to
// `dst`). One thread at a time.
#pragma once

#include <string>
#include <vector>

#include "converters/megatron/megatron_segments.h"
#include "formats/safetensors/st_dir.h"

namespace ckpt {

class MegatronSink final : public TensorSink {
 public:
  // `ranks[pp_rank * layout.tp + tp_rank]`: the Megatron tensors of that rank, each stored in
  // `dtypes[same index][tensor index]`. `args_json` is written as megatron_args.json.
  // `dirs` (MoE): each rank file's directory, one per entry of `ranks`; empty: tp x pp as above.
  MegatronSink(std::string dst, const Layout& layout, std::vector<std::vector<MegatronTensor>> ranks,
               std::vector<std::vector<DType>> dtypes, std::string args_json, bool fsync = true,
               std::vector<std::string> dirs = {});

  // What begin() must be given as pieces: one per non-padding segment, rank by rank, in segment
  // order, in the dtype of its Megatron tensor.
  const std::vector<Piece>& pieces() const { return pieces_; }

  // `pieces` must be pieces(); `tensors` the canonical tensors they name. Creates the rank files
  // and writes the padding rows.
  Status begin(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces,
               const nlohmann::json& metadata) override;
  Status write(size_t piece, const void* data, int64_t count) override;
  std::vector<size_t> write_order() const override;  // rank file by rank file, by file offset
  Status commit() override;
  void abort() override;

 private:
  // Where a piece (segment) lands: rank file, tensor in it, first element, element count.
  struct Target {
    size_t file;
    size_t inner;
    int64_t first;
    int64_t count;
    int64_t done = 0;
  };
  Status write_padding();

  safetensors::SafetensorsDirWriter dir_;
  Layout layout_;
  std::vector<std::vector<MegatronTensor>> ranks_;
  std::vector<std::vector<DType>> dtypes_;
  std::string args_json_;
  std::vector<std::string> dirs_;  // by rank file
  std::vector<Piece> pieces_;
  std::vector<Target> targets_;                          // by piece
  std::vector<safetensors::SafetensorsWriter*> writers_;  // by rank file, owned by dir_
};

}  // namespace ckpt
