// SafetensorsWriter: one .safetensors file as a ckpt::TensorSink. Declared pieces must be whole
// tensors (one per tensor, written in the piece's dtype); the layout is the reference writer's
// (dtype rank descending then name, __metadata__ first, compact JSON, spaces to a multiple of 8)
// and the header goes through the reader's validator first. Data arrives in order per piece and
// is written at its known offset (OutputFile: buffered or O_DIRECT, WriterOptions::io). Output: `<path>.tmp-<pid>`, fsync, rename at commit (or, with
// rename_on_commit = false, the final name directly: the caller commits a whole directory).
// Thread safety: one thread at a time.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "formats/base/fs_util.h"
#include "formats/io/output_file.h"
#include "formats/safetensors/st_header.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt::safetensors {

struct WriterOptions {
  // The header's "__metadata__" (written only when write_metadata).
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
  bool write_metadata = true;
  bool rename_on_commit = true;
  bool fsync = true;
  IoMode io = IoMode::kAuto;  // how tensor bytes are written (formats/io/output_file.h)
  SourceBlocks* read_ahead = nullptr;  // copies (write_from_files) read their sources direct through it; not owned
  // Direct writes staged in its large buffers, several in flight (OutputFile::set_write_pool); not owned.
  WritePool* write_pool = nullptr;
};

class SafetensorsWriter final : public TensorSink {
 public:
  explicit SafetensorsWriter(std::string path, WriterOptions opts = {});
  ~SafetensorsWriter() override;
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // `metadata` is ignored (the header's __metadata__ comes from WriterOptions).
  Status begin(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces, const nlohmann::json& metadata) override;
  Status write(size_t piece, const void* data, int64_t count) override;
  // Writes `count` elements at element `first` of piece `piece`, for a sink that fills a tensor
  // in parts in any order (MegatronSink). A piece is written either in order by write() or in
  // non-overlapping parts by write_at(), not both; commit() checks that the bytes add up.
  Status write_at(size_t piece, int64_t first, const void* data, int64_t count);
  bool accepts_file_extents() const override { return true; }
  std::vector<size_t> write_order() const override;  // by file offset
  uint64_t piece_offset(size_t piece) const { return piece < slots_.size() ? slots_[piece].begin : 0; }
  Status write_from_file(size_t piece, const FileExtent& src, int64_t count) override { return write_from_files(piece, {src}, count); }
  bool gathers_file_runs() const override { return true; }
  Status write_from_files(size_t piece, const std::vector<FileExtent>& runs, int64_t count) override;  // OutputFile::copy_runs
  Status commit() override;
  void abort() override;

  uint64_t file_size() const { return file_size_; }

 private:
  std::string path_, tmp_;
  WriterOptions opts_;
  OutputFile out_;
  bool committed_ = false;
  uint64_t data_start_ = 0, file_size_ = 0;
  struct Slot {
    std::string name;
    uint64_t begin = 0;     // absolute file offset of the tensor's first byte
    uint64_t bytes = 0;
    uint64_t written = 0;   // bytes so far
    size_t elem = 1;
  };
  std::vector<Slot> slots_;  // by piece index
  // Checks a write of `count` elements to `piece`; returns its slot and byte count.
  Result<std::pair<Slot*, uint64_t>> next_run(size_t piece, int64_t count);
};

}  // namespace ckpt::safetensors
