// DistSegmentSink: a TensorSink in canonical view that fills the chunks of a torch_dist map
// (converters/megatron/dist/megatron_dist_map.h) in a DcpWriter. Its pieces are the non-padding segments of
// every chunk (boxes of canonical tensors), so the reshard engine fills them from any source;
// each segment is a contiguous run of its chunk, forwarded to the DcpWriter piece of that chunk;
// padding segments are written as zeros by the sink. Writes of one chunk must arrive in segment
// order: write_order() gives that order (the executor follows it); anything else is refused.
// One thread at a time.
#pragma once

#include <string>
#include <vector>

#include "converters/megatron/dist/megatron_dist_map.h"
#include "formats/torch/dcp/dcp_writer.h"

namespace ckpt {

class DistSegmentSink final : public TensorSink {
 public:
  // `dtypes[i]`: the stored dtype of map[i]. `extra_files`: (name, bytes) written into the
  // output directory before commit (common.pt, metadata.json).
  DistSegmentSink(std::string dst, std::vector<DistTensor> map, std::vector<DType> dtypes,
                  std::vector<torch::DcpBytesEntry> bytes, std::vector<std::pair<std::string, std::string>> extra_files,
                  WritePool* write_pool = nullptr);  // the DCP files' direct writes (DcpWriterOptions::write_pool)

  // What begin() must be given as pieces (one per non-padding segment, chunk by chunk).
  const std::vector<Piece>& pieces() const { return pieces_; }

  Status begin(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces,
               const nlohmann::json& metadata) override;
  Status write(size_t piece, const void* data, int64_t count) override;
  std::vector<size_t> write_order() const override;
  Status commit() override;
  void abort() override;

 private:
  struct Seg {
    size_t chunk;        // inner piece
    int64_t count;       // elements
    int64_t piece = -1;  // outer piece; -1: zero padding
  };
  struct Chunk {
    std::vector<size_t> segs;  // into segs_, in order
    size_t next = 0;           // segment being written
    int64_t done = 0;          // elements of it written
  };
  Status advance_padding(size_t chunk);

  std::string dst_;
  std::vector<DistTensor> map_;
  std::vector<DType> dtypes_;
  std::vector<std::pair<std::string, std::string>> extra_files_;
  std::vector<TensorMeta> inner_tensors_;
  std::vector<Piece> inner_pieces_, pieces_;
  std::vector<Seg> segs_;
  std::vector<size_t> seg_of_piece_;
  std::vector<Chunk> chunks_;
  torch::DcpWriter writer_;
};

}  // namespace ckpt
