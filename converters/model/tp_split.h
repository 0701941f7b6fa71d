// What one tensor-parallel rank holds of a tensor, as boxes: a slice of one dimension, and the
// rows of a vocab-parallel tensor (embedding, output head). The one home of these two rules for
// LlamaShardingRules (native layouts) and the Megatron segment map. Pure functions, thread safe.
#pragma once

#include <cstdint>

#include "formats/base/status.h"
#include "formats/tensor/region.h"

namespace ckpt {

// Box of indices [begin, end) of dimension `dim` of `shape`, whole in every other dimension.
Box dim_slice(const Shape& shape, size_t dim, int64_t begin, int64_t end);

// Vocab-parallel split: the vocabulary of `vocab` rows is padded to `padded` rows
// (Layout::padded_vocab), split evenly over `tp` ranks, and rank `rank`'s part clipped to the
// real rows. A rank holds real rows [begin, end) (possibly none), then `padding` rows of zeros;
// end - begin + padding == padded / tp.
struct VocabPart {
  int64_t begin = 0, end = 0;
  int64_t padding = 0;
};

// kInternal when `padded` is smaller than `vocab` or not a multiple of tp (Layout::padded_vocab
// never gives such a value), or rank is outside [0, tp).
Result<VocabPart> vocab_parallel_part(int64_t vocab, int64_t padded, int tp, int rank);

}  // namespace ckpt
