#include "converters/model/tp_split.h"

#include <algorithm>
#include <string>

namespace ckpt {

Box dim_slice(const Shape& shape, size_t dim, int64_t begin, int64_t end) {
  Box b = Box::whole(shape);
  b.offset[dim] = begin;
  b.extent[dim] = end - begin;
  return b;
}

Result<VocabPart> vocab_parallel_part(int64_t vocab, int64_t padded, int tp, int rank) {
  if (tp < 1 || rank < 0 || rank >= tp || padded < vocab || padded % tp != 0)
    return Status::Internal("padded vocab " + std::to_string(padded) + " for vocab " + std::to_string(vocab) +
                            " at tp=" + std::to_string(tp) + " rank " + std::to_string(rank));
  const int64_t part = padded / tp;
  VocabPart v;
  v.begin = std::min<int64_t>(rank * part, vocab);
  v.end = std::min<int64_t>((rank + 1) * part, vocab);
  v.padding = part - (v.end - v.begin);
  return v;
}

}  // namespace ckpt
