// Writer of the native store (manifest version 2, each piece's digest in opts.digest): a TensorSink for one process, plus the two halves of the
// multi-rank (MPI) protocol, which share all the code:
//   rank 0:    StoreWriter::prepare_partial(dst)                      (then a barrier)
//   each rank: auto w = StoreWriter::open_rank(partial_dir(dst), rank, tensors, my_pieces, opts);
//              w->write(i, data, n) ...; auto recs = w->close();       (records -> JSON -> gather)
//   rank 0:    StoreWriter::finalize(dst, tensors, all_records, metadata, opts)
// finalize() validates the union with the reader's validator, writes manifest.json LAST into
// `<dst>.partial/`, fsyncs files and directories, and renames `<dst>.partial` to `<dst>`.
// Uncompressed pieces are contiguous datasets allocated when the shard is created; ckpt writes
// their bytes itself (OutputFile: buffered or O_DIRECT as opts.io says, from memory or gathered
// from source files), HDF5 only the metadata.
// Thread safety: one thread per object; HDF5 calls take h5_lock(), digests run on helper threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/base/status.h"
#include "formats/store/manifest.h"
#include "formats/store/store_options.h"
#include "formats/tensor/tensor_io.h"
#include "formats/tensor/write_placement.h"

namespace ckpt::store {

// Writes the pieces of one rank into `<partial_dir>/shards/r<rank:05>.h5` (one dataset per piece).
class ShardWriter {
 public:
  // Validates the pieces (known tensors, regions inside them) and creates the file and datasets.
  static Result<std::unique_ptr<ShardWriter>> open(const std::string& partial_dir, int rank,
                                                   const std::vector<TensorMeta>& tensors,
                                                   const std::vector<Piece>& pieces, const StoreOptions& opts);
  ~ShardWriter();
  // Next `count` elements (storage order) of local piece `piece` (index into the open() list).
  Status write(size_t piece, const void* data, int64_t count);
  // Uncompressed shards: the next `count` elements of `piece` copied from file ranges written
  // back to back (OutputFile::copy_runs) and hashed on the way, on the hash threads (pieces in
  // parallel, each in order); returns once queued. The ranges must stay readable until close()
  // or abort() returns.
  bool accepts_file_extents() const;
  // Uncompressed pieces: the file offset of the first element (WritePlacement).
  std::optional<uint64_t> piece_file_offset(size_t piece) const;
  Status write_from_file(size_t piece, const FileExtent& src, int64_t count) { return write_from_files(piece, {src}, count); }
  Status write_from_files(size_t piece, const std::vector<FileExtent>& runs, int64_t count);
  // All pieces complete? Closes and fsyncs the file; returns the manifest records of the pieces.
  Result<std::vector<PieceRecord>> close();
  void abort();  // closes handles; the caller removes the partial directory

  struct Impl;

 private:
  explicit ShardWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class StoreWriter final : public TensorSink, public WritePlacement {
 public:
  explicit StoreWriter(std::string dst, StoreOptions opts = {});
  ~StoreWriter() override;

  Status begin(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces,
               const nlohmann::json& metadata) override;
  Status write(size_t piece, const void* data, int64_t count) override;
  bool accepts_file_extents() const override { return opts_.codec == Codec::kNone; }
  // Largest pieces first: the hash threads finish together instead of one hashing the last big
  // piece alone (the file layout is fixed at begin(), so the order changes no byte).
  std::vector<size_t> write_order() const override;
  std::optional<uint64_t> piece_file_offset(size_t piece) const override {  // WritePlacement
    return shard_ ? shard_->piece_file_offset(piece) : std::nullopt;
  }
  Status write_from_file(size_t piece, const FileExtent& src, int64_t count) override { return write_from_files(piece, {src}, count); }
  bool gathers_file_runs() const override { return accepts_file_extents(); }
  Status write_from_files(size_t piece, const std::vector<FileExtent>& runs, int64_t count) override;
  Status commit() override;
  void abort() override;

  static std::string partial_dir(const std::string& dst);  // "<dst>.partial"
  // Fails if `dst` exists; removes a stale `<dst>.partial` and creates it with `shards/`.
  static Status prepare_partial(const std::string& dst);
  static Result<std::unique_ptr<ShardWriter>> open_rank(const std::string& partial_dir, int rank,
                                                        const std::vector<TensorMeta>& tensors,
                                                        const std::vector<Piece>& pieces,
                                                        const StoreOptions& opts = {}) {
    return ShardWriter::open(partial_dir, rank, tensors, pieces, opts);
  }
  static Status finalize(const std::string& dst, const std::vector<TensorMeta>& tensors,
                         std::vector<PieceRecord> records, const nlohmann::json& metadata,
                         const StoreOptions& opts = {});

 private:
  std::string dst_;
  StoreOptions opts_;
  std::vector<TensorMeta> tensors_;
  std::vector<Piece> pieces_;
  nlohmann::json metadata_;
  std::unique_ptr<ShardWriter> shard_;
  bool begun_ = false, done_ = false;
};

}  // namespace ckpt::store
