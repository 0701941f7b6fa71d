// DcpWriter: a TensorSink that writes a PyTorch Distributed Checkpoint directory in the format of
// torch 2.13's FileSystemWriter with its default SerializationFormat.TORCH_SAVE, which
// torch.distributed.checkpoint.load (and torchtitan, Megatron-Core's torch_dist loader) reads:
//   <dir>/__<rank>_0.distcp  per writer rank: its bytes items (written verbatim), then one item per
//                            piece: a torch.save zip (archive "archive") of that chunk of the
//                            tensor, dense, in the tensor's dtype (formats/torch/torch_file_writer.h)
//   <dir>/.metadata          pickle of torch.distributed.checkpoint.metadata.Metadata(
//                              state_dict_metadata = {fqn: TensorStorageMetadata(TensorProperties(
//                                dtype, strided, False, contiguous, False), torch.Size(size),
//                                [ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes))...])
//                                | BytesStorageMetadata()},
//                              planner_data = {fqn: (fqn,)},      (the default planner's flat keys)
//                              storage_data = {MetadataIndex(fqn, torch.Size(offsets), index):
//                                filesystem._StorageInfo(relative_path, offset, length)},
//                              storage_meta = StorageMeta(None, save_id, None, []),
//                              version = "1.0.0")
//                            with the objects' pickled state exactly as Python pickles them
//                            (dataclasses: NEWOBJ + BUILD of their __dict__; TensorProperties:
//                            its __getstate__ tuple with torch.serialization._get_layout and
//                            _MEM_FORMAT_ENCODING(0); torch.Size as REDUCE of a tuple).
// Pieces must be boxes in their tensor's dtype, inside it, not overlapping, and together cover
// every tensor (a chunk missing from the metadata would leave the loader's tensor unset).
// Everything goes under <dir>.partial (PartialDir) and is renamed to <dir> at commit; abort or a
// failed commit removes it. Item sizes are known at begin(), so every piece's bytes are pwritten
// in place as they arrive (slabs, pieces interleaved in any order): memory is O(pieces).
// Thread safety: one thread at a time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "formats/base/fs_util.h"
#include "formats/tensor/tensor_io.h"
#include "formats/torch/dcp/dcp.h"
#include "formats/torch/torch_file_writer.h"

namespace ckpt::torch {

struct DcpBytesEntry {
  std::string fqn;
  // Written verbatim. torch's DCP loader hands it to torch.load: a torch.save zip of the object
  // (torch_save_bytes) is what torch itself writes for a non-tensor state dict entry.
  std::string data;
  int rank = 0;
};

struct DcpWriterOptions {
  // Per declared piece: the writer rank whose file `__<rank>_0.distcp` holds it. Empty: rank 0.
  std::vector<int> piece_rank;
  std::vector<DcpBytesEntry> bytes;
  bool fsync = true;
  bool force_zip64 = false;  // items with ZIP64 records (tests)
  PartialDirPolicy policy;
  std::string save_id;       // StorageMeta.save_id; empty: a random UUID-like id
  // planner_data {fqn: (fqn,)} as the default planner with flatten_state_dict=True writes it;
  // false: None, as a planner that does not flatten (Megatron-Core's) writes it.
  bool flat_planner_data = true;
  IoMode io = IoMode::kAuto;        // how item bytes are written (formats/io/output_file.h)
  WritePool* write_pool = nullptr;  // direct writes staged there, several in flight across the files; not owned
};

class DcpWriter final : public TensorSink {
 public:
  explicit DcpWriter(std::string dir, DcpWriterOptions opts = {});
  ~DcpWriter() override;
  DcpWriter(const DcpWriter&) = delete;
  DcpWriter& operator=(const DcpWriter&) = delete;

  // `metadata` is not stored (DCP has no place for it).
  Status begin(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces, const nlohmann::json& metadata) override;
  Status write(size_t piece, const void* data, int64_t count) override;
  bool accepts_file_extents() const override { return true; }
  Status write_from_file(size_t piece, const FileExtent& src, int64_t count) override;
  std::vector<size_t> write_order() const override;  // by file, then offset
  Status commit() override;
  void abort() override;

  // The metadata as written at commit (valid after begin()).
  const DcpMetadata& metadata() const { return md_; }

 private:
  struct Item {
    std::unique_ptr<TorchZipWriter> zip;
    size_t file = 0;
    uint64_t base = 0;
    size_t elem = 1;
    std::string tensor;
  };
  struct File {
    std::string name;
    OutputFile out;
    uint64_t size = 0;
  };
  std::string dir_;
  DcpWriterOptions opts_;
  PartialDir partial_;
  std::vector<Item> items_;  // by piece
  std::vector<File> files_;
  std::vector<std::pair<size_t, uint64_t>> bytes_at_;  // per opts_.bytes: file, offset
  DcpMetadata md_;
  bool begun_ = false, committed_ = false;

  Status check_pieces(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces) const;
  Status lay_out(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces);
};

// The bytes of a DCP `.metadata` file for `md` (chunk files/offsets/lengths as given).
Result<std::string> pickle_dcp_metadata(const DcpMetadata& md, const std::string& save_id, bool flat_planner_data = true);

// A torch.save zip of `root` (which names no storages), in memory: a DCP bytes item.
Result<std::string> torch_save_bytes(const PyObj* root);

}  // namespace ckpt::torch
