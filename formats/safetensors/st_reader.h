// SafetensorsFile: one .safetensors file as a ckpt::TensorSource (one piece per tensor = its whole
// box, in the file's dtype). open() validates the whole header against the file size before
// anything is used (rules: st_header.h, docs/SAFETENSORS.md); read() preads only the bytes of the
// requested sub-box. Thread safety: immutable after open(); read() may be called concurrently.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "formats/base/file_io.h"
#include "formats/safetensors/st_header.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt::safetensors {

class SafetensorsFile final : public TensorSource {
 public:
  static Result<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  ~SafetensorsFile() override;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const Header& header() const { return header_; }
  const std::string& path() const { return path_; }
  uint64_t file_size() const { return file_size_; }

  const std::vector<TensorMeta>& tensors() const override { return metas_; }
  const std::vector<Piece>& pieces() const override { return pieces_; }
  // Errors: SliceOutOfRange / TooManySlices (kInvalidArgument) for a bad `sub`; kIo on a short
  // read (file truncated after open).
  Status read(size_t piece, const Box& sub, void* dst) override;
  // The bytes of `sub` as one range of the file, when they are one row-major run of the tensor.
  std::optional<FileExtent> file_extent(size_t piece, const Box& sub) override;
  // {"safetensors_metadata": {...__metadata__...}} (null when absent).
  const nlohmann::json& metadata() const override { return meta_json_; }
  std::string describe() const override { return path_; }
  // safetensors has no checksums: check() reads every byte (structure only).
  IntegrityInfo integrity() const override {
    return {"safetensors", "", "safetensors has no checksums: structure validated and every byte read, content integrity not checkable", {}};
  }

  // Raw bytes [begin, begin + n) of the data buffer (offsets as in data_offsets); checked.
  Status read_data(uint64_t begin, void* dst, uint64_t n) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  int fd_ = -1;
  uint64_t file_size_ = 0;
  Header header_;
  std::vector<TensorMeta> metas_;  // same order as header_.tensors (by data offset)
  std::vector<Piece> pieces_;
  nlohmann::json meta_json_;
};

}  // namespace ckpt::safetensors
