#include "reshard/part_io.h"

#include <cstring>
#include <utility>

namespace ckpt {

Status read_part(TensorSource& src, const SourcePart& p, void* dst) {
  Status st = src.read(p.piece, p.box, dst);
  if (!st.ok()) {
    const Piece& sp = src.pieces()[p.piece];
    return std::move(st).with_tensor(sp.tensor).with_context("reading " + p.box.to_string() + " of source " +
                                                             piece_desc(p.piece, sp) + " from " + src.describe());
  }
  return st;
}

Status cast_with_context(const void* in, DType from, void* out, DType to, size_t n, const CastOptions& cast,
                         const std::string& tensor, const Box& box) {
  if (from == to) {
    std::memcpy(out, in, n * dtype_size(to));
    return Status::Ok();
  }
  Status st = cast_elements(in, from, out, to, n, cast);
  if (!st.ok())
    return std::move(st).with_tensor(tensor).with_context("casting " + box.to_string() + " of '" + tensor + "' from " +
                                                          std::string(dtype_name(from)) + " to " +
                                                          std::string(dtype_name(to)));
  return st;
}

}  // namespace ckpt
