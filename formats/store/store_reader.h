// Reader of the native store, manifest versions 1 to 3 (a TensorSource). open() validates the
// manifest (see manifest.h; version 3: its checksum) and every shard file and dataset before any
// use: present, declared shape and dtype, and stored as the writer stores the piece's codec
// (check_storage: contiguous, unfiltered and exactly the manifest's bytes inside the file, or
// chunked with the codec's filters), so no read path meets HDF5 metadata that disagrees with the
// manifest; read() fetches any sub-box of a piece with an HDF5 hyperslab (never the whole piece; a box
// of a tensor across pieces, with casts, is the engine's read_global_box in reshard/executor.h);
// verify() recomputes every piece's digest with the algorithm its record names (xxh3-128 or
// sha256) from the stored bytes, streamed in bounded chunks.
// Thread safety: one thread at a time per reader (HDF5 calls also take h5_lock()).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "formats/io/output_file.h"
#include "formats/store/chunk_reader.h"
#include "formats/store/h5/h5_handles.h"
#include "formats/store/manifest.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt::store {

// A store's check outcome is the general one (formats/tensor/source_check.h); a unit is a piece.
using VerifyFailure = CheckFailure;
using VerifyReport = CheckReport;

class StoreReader final : public TensorSource {
 public:
  // `path`: a checkpoint dir or a run dir (follows `latest`).
  static Result<std::unique_ptr<StoreReader>> open(const std::string& path);
  ~StoreReader() override;

  const std::vector<TensorMeta>& tensors() const override { return manifest_.tensors; }
  const std::vector<Piece>& pieces() const override { return pieces_; }
  Status read(size_t piece, const Box& sub, void* dst) override;
  // For an uncompressed (contiguous) dataset and a sub-box whose bytes are one row-major run of
  // the piece: where they lie in the shard file (checked inside the file). Box pieces only.
  std::optional<FileExtent> file_extent(size_t piece, const Box& sub) override;
  const nlohmann::json& metadata() const override { return manifest_.metadata; }
  std::string describe() const override { return dir_; }
  // "ckpt-native vN", "<algorithm> piece digests" (each piece's record names its algorithm).
  IntegrityInfo integrity() const override;
  // verify_pieces() over the share's pieces, read as o.io says.
  CheckReport check(const CheckOptions& o) override;
  // The piece's digest recomputed once (whole piece); thread-safe.
  Status check_piece(size_t piece) override;
  void set_read_threads(int threads) override { set_decode_threads(threads); }
  // An uncompressed piece: its dataset's file range and digest. Not thread-safe (dataset_extent).
  std::optional<RangeCheck> range_check(size_t piece) override;
  // The shard file, the dataset's size in it (compressed size when compressed), the codec.
  PieceStorage piece_storage(size_t piece) override;
  // Compressed pieces: a decode buffer per decoding thread.
  uint64_t read_memory(int threads) const override;

  const Manifest& manifest() const { return manifest_; }
  // Where an uncompressed piece's bytes lie in its shard file (checked at open); nullopt for
  // compressed or empty pieces. Not thread-safe (opens the file's descriptor on first use).
  std::optional<FileExtent> stored_extent(size_t piece) { return dataset_extent(piece); }
  const std::string& dir() const { return dir_; }
  // Elements [begin, end) of piece `piece` in storage order, into `dst` (stored dtype).
  Status read_storage_range(size_t piece, int64_t begin, int64_t end, void* dst);
  // Compressed pieces: a read spanning several chunks decodes them on `threads` threads (the
  // calling one and threads - 1 helpers); 1 (the default): on the calling thread only.
  void set_decode_threads(int threads);
  // How verify() reads uncompressed pieces' file ranges (SourceWindow, formats/io/source_window.h):
  // kBuffered (the default) mapped; kDirect with O_DIRECT; kAuto direct where not in the page cache.
  void set_read_io(IoMode m) { read_io_ = m; }
  // Bytes the piece's dataset takes in its file (compressed size when compressed).
  uint64_t stored_bytes(size_t piece);
  // Recomputes every checksum, `threads` pieces at a time; an uncompressed piece is hashed straight
  // from its file range (mapped, no copy), others through HDF5. `progress(done_bytes,
  // total_bytes)` is called on the calling thread as pieces complete.
  VerifyReport verify(const std::function<void(uint64_t, uint64_t)>& progress = nullptr, int threads = 2);
  // The same for the pieces `which` only (indices into pieces(); a share of a distributed check).
  VerifyReport verify_pieces(const std::vector<size_t>& which,
                             const std::function<void(uint64_t, uint64_t)>& progress = nullptr, int threads = 2);

 private:
  StoreReader() = default;
  Status open_files();
  // The dataset's storage against piece i's record (docs/STORE_FORMAT.md, "Shards"); sets
  // raw_offsets_[i] and chunked_[i]. Rule codes: LayoutMismatch, FilterMismatch,
  // StorageSizeMismatch, StorageOutOfFile, ChunkShapeMismatch (version 3). Under h5_lock().
  Status check_storage(size_t i, hid_t ds, uint64_t file_size, const std::string& path, const std::string& where);
  Status error_context(Status st, size_t piece) const;
  // The raw byte range of piece `piece`'s dataset when it is uncompressed and not empty (checked
  // at open; not thread-safe: opens the file's descriptor on first use).
  std::optional<FileExtent> dataset_extent(size_t piece);
  Status hash_piece(size_t piece, const std::optional<FileExtent>& raw, std::string* hex);  // rec's algorithm

  std::string dir_;
  Manifest manifest_;
  std::vector<Piece> pieces_;
  std::unordered_map<std::string, H5Id> files_;
  std::vector<H5Id> datasets_;
  // Compressed datasets chunked as the store writes them: read and decoded chunk by chunk outside
  // HDF5's lock (formats/store/chunk_reader.h); nullopt: HDF5's own path.
  std::vector<std::optional<ChunkedDataset>> chunked_;
  std::unique_ptr<ThreadPool> decode_pool_;  // set_decode_threads
  IoMode read_io_ = IoMode::kBuffered;       // set_read_io
  // file_extent(): raw file offset of each piece's data (set at open; -1: compressed or empty) and
  // plain descriptors of the shard files, opened on first use.
  std::vector<int64_t> raw_offsets_;
  std::unordered_map<std::string, int> fds_;
  // check_piece(): per piece 0 not checked, 1 matched, 2 failed (its status kept).
  std::mutex checked_mu_;
  std::vector<uint8_t> checked_;
  std::unordered_map<size_t, Status> check_failed_;
};

}  // namespace ckpt::store
