// The two interfaces every checkpoint format implements, and the engine (reshard/) speaks.
//  - TensorMeta: a global tensor (canonical name, dtype, full shape).
//  - Piece: one stored region of one global tensor, held in one dtype (the dtype a piece is
//    stored in may differ from the tensor's; readers return the stored dtype).
//  - TensorSource: lists tensors and pieces; reads any sub-box of a piece; says what its format
//    can check of the stored bytes and checks it (integrity / check / check_piece). Wrappers
//    (profile views, canonical views) forward these: a capability is asked for through this
//    interface, never found by a dynamic_cast to a concrete reader.
//  - TensorSink: declares its pieces up front, takes each piece's bytes as row slabs in order,
//    commits atomically (or aborts leaving nothing that looks complete).
// Thread safety: an implementation states it; the default is one thread at a time.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/base/status.h"
#include "formats/digest/digest.h"
#include "formats/dtype/dtype.h"
#include "formats/tensor/region.h"
#include "formats/tensor/source_check.h"

namespace ckpt {

struct TensorMeta {
  std::string name;  // canonical global name (HF names for the LLaMA family)
  DType dtype = DType::kF32;
  Shape shape;
  bool operator==(const TensorMeta& o) const = default;
};

struct Piece {
  std::string tensor;  // TensorMeta::name
  Region region;       // which elements of the global tensor
  DType dtype = DType::kF32;  // stored element type
  bool operator==(const Piece& o) const = default;
};

// A run of bytes in an open file, stored raw (little-endian, the piece's dtype, uncompressed).
struct FileExtent {
  int fd = -1;          // owned by the source; valid while the source lives
  uint64_t offset = 0;  // byte offset in the file
  uint64_t bytes = 0;
};

// Where and how a piece is stored, for `inspect`: the file holding it (relative to the checkpoint,
// or a file name), its bytes on disk, its codec ("none", "shuffle+zstd-1"). Unknown: empty.
struct PieceStorage {
  std::string file = {};
  std::optional<uint64_t> stored_bytes = {};
  std::string codec = {};
};

// A unit whose check is a digest over one file range as stored (a native piece stored raw): a copy
// that reads that range anyway can check it from its own reads (reshard/source_verify.h CopyVerify).
struct RangeCheck {
  FileExtent extent;   // the whole unit's bytes
  DigestValue digest;  // what they must hash to
};

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual const std::vector<TensorMeta>& tensors() const = 0;
  virtual const std::vector<Piece>& pieces() const = 0;
  // Reads the sub-box `sub` (global coordinates) of piece `piece` into `dst`, dense row-major of
  // extent sub.extent, in the piece's stored dtype. For a flat piece `sub` must lie inside one
  // box of pieces()[piece].region.boxes(). Reads only what is needed.
  virtual Status read(size_t piece, const Box& sub, void* dst) = 0;
  // When the bytes read(piece, sub) would return lie as they are in one contiguous range of a
  // file: that range, so a sink can copy file to file (copy_file_bytes) instead. Default: none.
  virtual std::optional<FileExtent> file_extent(size_t piece, const Box& sub) {
    (void)piece;
    (void)sub;
    return std::nullopt;
  }
  // Free-form metadata (model config, layout, trainer state) carried by the checkpoint.
  virtual const nlohmann::json& metadata() const = 0;
  virtual std::string describe() const = 0;  // path, for messages

  // Integrity (ARCHITECTURE.md "Integrity and I/O"): what the format can check of the bytes.
  // Default: nothing ("<describe()> has no checksums").
  virtual IntegrityInfo integrity() const;
  // The format's own checks over every stored unit of share o.share of o.shares: digests or
  // checksums recomputed from the stored bytes. A format without any has every byte of every
  // piece read (structure only; integrity() says what cannot be checked). Default: that read.
  virtual CheckReport check(const CheckOptions& o);
  // Checks the stored units that hold piece `piece` (whole units; each unit once per source, later
  // calls are free) before its bytes are used: the check for readers that do not read everything
  // (ckpt.open(...).read, a trainer rank's resume). OK when the format has nothing to check.
  // Thread-safe where read() is. Default: OK.
  virtual Status check_piece(size_t piece);
  // The range check of the unit holding piece `piece` (the same unit for pieces sharing it), when
  // the format's check of it is a digest of one stored file range. Default: none (check_piece).
  virtual std::optional<RangeCheck> range_check(size_t piece) {
    (void)piece;
    return std::nullopt;
  }
  // Where piece `piece` is stored (for inspect's files, sizes on disk and codecs). Default: unknown.
  virtual PieceStorage piece_storage(size_t piece) {
    (void)piece;
    return {};
  }
  // Hints for the reads that follow: decode compressed data on `threads` threads (default: none).
  virtual void set_read_threads(int threads) { (void)threads; }
  // Memory the source's reads take beside the caller's buffers with `threads` reading threads
  // (decode buffers of compressed data); counted in a job's --max-memory. Default: 0.
  virtual uint64_t read_memory(int threads) const {
    (void)threads;
    return 0;
  }
};

// A wrapper's check(): `inner`'s, with the failures' piece indices cleared where the wrapper
// numbers its pieces differently (`same_pieces` false): they index inner's pieces.
CheckReport check_of_inner(TensorSource& inner, const CheckOptions& o, bool same_pieces);

// The default check(): every piece of `src` (of the share) read in chunks of at most
// `chunk_bytes`; a failing read is recorded (piece, tensor) and the scan goes on.
CheckReport read_all_pieces(TensorSource& src, const CheckOptions& o, uint64_t chunk_bytes = 16ull << 20);

class TensorSink {
 public:
  virtual ~TensorSink() = default;
  // Declares every tensor and piece before any write. Validates them (pieces inside their
  // tensors, no overlap between pieces of one tensor) and fails before touching the disk.
  virtual Status begin(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces,
                       const nlohmann::json& metadata) = 0;
  // Writes the next `count` elements (in storage order) of piece `piece`. The writes of a piece
  // arrive in order and cover it exactly once; pieces may be interleaved.
  virtual Status write(size_t piece, const void* data, int64_t count) = 0;
  // Sinks that can take the next `count` elements of a piece straight from a file range
  // (TensorSource::file_extent, extent.bytes == count * element size) say so and implement
  // write_from_file; it then stands for write() of those bytes.
  virtual bool accepts_file_extents() const { return false; }
  // After begin(): the piece order in which writes land sequentially in the sink's files (pieces
  // may be written in any order; this one avoids seeking). Empty: declaration order.
  virtual std::vector<size_t> write_order() const { return {}; }
  virtual Status write_from_file(size_t piece, const FileExtent& src, int64_t count) {
    (void)piece;
    (void)src;
    (void)count;
    return Status::Internal("this sink does not take file extents");
  }
  // Sinks that gather say so: the next `count` elements of a piece as several ranges written back
  // to back (e.g. each output row from the column blocks of tp ranks) in one call. The default
  // is one write_from_file per range (all ranges hold whole elements).
  virtual bool gathers_file_runs() const { return false; }
  virtual Status write_from_files(size_t piece, const std::vector<FileExtent>& runs, int64_t count) {
    uint64_t total = 0;
    for (const FileExtent& r : runs) total += r.bytes;
    for (const FileExtent& r : runs) {
      const int64_t n = total ? static_cast<int64_t>(r.bytes * static_cast<uint64_t>(count) / total) : 0;
      Status st = write_from_file(piece, r, n);
      if (!st.ok()) return st;
    }
    return Status::Ok();
  }
  // Makes the output visible atomically (temp name, fsync, rename). After a failed commit or an
  // abort nothing at the destination looks like a complete checkpoint.
  virtual Status commit() = 0;
  virtual void abort() = 0;
};

}  // namespace ckpt
