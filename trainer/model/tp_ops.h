// Vocab-parallel kernels of the reference trainer (Megatron-LM): the embedding lookup and the
// cross-entropy when each tensor-parallel rank holds a contiguous range of vocabulary rows of the
// embedding / output head (padded rows are never held, so they never count). With comm == null
// (one TP rank) they are the plain kernels of trainer/model/ops.h, with identical results.
// Thread safety: pure functions on caller buffers plus collectives on `comm` (main thread only).
#pragma once

#include <cstdint>

#include "formats/base/status.h"
#include "reshard/dist/comm.h"

namespace ckpt::trainer {

// Vocabulary rows [begin, end) held by this rank (possibly empty).
struct VocabRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool holds(int64_t row) const { return row >= begin && row < end; }
};

// x[n, D] = table[tokens] where table [r.size(), D] holds rows r of the embedding; rows outside
// r are zero here and the sum over `comm` fills them in. Tokens are checked by the caller.
template <class T>
Status vocab_parallel_embedding(const T* table, VocabRange r, const int32_t* tokens, int64_t n, int64_t D,
                                T* x, Comm* comm);
// dtable[r.size(), D] += the rows of dx[n, D] whose token lies in r (dx identical on every rank).
template <class T>
void vocab_parallel_embedding_backward(T* dtable, VocabRange r, const int32_t* tokens, int64_t n, int64_t D,
                                       const T* dx);

// Cross-entropy of logits [n, r.size()] (the columns r of the full [n, V] logits) against targets
// [n] in [0, V): max, sum of exponentials and target logit reduced over `comm`. Returns the SUM of
// the token losses, the same on every rank. dlogits (nullable, may alias logits) receives
// scale * d(sum)/d(logits) for the local columns.
template <class T>
Result<double> vocab_parallel_cross_entropy(const T* logits, VocabRange r, const int32_t* targets, T* dlogits,
                                            int64_t n, T scale, Comm* comm);

}  // namespace ckpt::trainer
