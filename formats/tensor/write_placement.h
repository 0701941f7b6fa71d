// WritePlacement: a TensorSink that writes each piece's elements back to back into one file at a
// fixed offset may also implement this, saying at which byte offset a piece's first element
// lands. The executor (reshard/chunk_pipeline.h, which finds it with a dynamic_cast) then holds
// each chunk in memory at the same address modulo 4 KiB as its file offset, so a direct-I/O
// sink writes it without a staging copy (formats/io/output_file.h OutputFile::write). A hint
// only: the sink accepts any buffer and writes the same bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace ckpt {

class WritePlacement {
 public:
  virtual ~WritePlacement() = default;
  // After begin(): the file offset of piece `piece`'s first element; nullopt when unknown
  // (compressed pieces, another kind of file).
  virtual std::optional<uint64_t> piece_file_offset(size_t piece) const = 0;
};

}  // namespace ckpt
