#include "trainer/model/tp_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "trainer/model/ops.h"

namespace ckpt::trainer {

template <class T>
Status vocab_parallel_embedding(const T* table, VocabRange r, const int32_t* tokens, int64_t n, int64_t D,
                                T* x, Comm* comm) {
  for (int64_t i = 0; i < n; ++i) {
    T* dst = x + i * D;
    if (r.holds(tokens[i]))
      std::memcpy(dst, table + (tokens[i] - r.begin) * D, sizeof(T) * static_cast<size_t>(D));
    else
      std::fill(dst, dst + D, T(0));
  }
  if (!comm || comm->size() == 1) return Status::Ok();
  return comm->all_reduce_sum<T>(x, n * D);
}

template <class T>
void vocab_parallel_embedding_backward(T* dtable, VocabRange r, const int32_t* tokens, int64_t n, int64_t D,
                                       const T* dx) {
  for (int64_t i = 0; i < n; ++i) {
    if (!r.holds(tokens[i])) continue;
    T* row = dtable + (tokens[i] - r.begin) * D;
    const T* src = dx + i * D;
    for (int64_t j = 0; j < D; ++j) row[j] += src[j];
  }
}

template <class T>
Result<double> vocab_parallel_cross_entropy(const T* logits, VocabRange r, const int32_t* targets, T* dlogits,
                                            int64_t n, T scale, Comm* comm) {
  if (!comm || comm->size() == 1) return cross_entropy<T>(logits, targets, dlogits, n, r.size(), scale);
  const int64_t Vl = r.size();
  std::vector<T> mx(static_cast<size_t>(n), std::numeric_limits<T>::lowest());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < Vl; ++j) mx[i] = std::max(mx[i], logits[i * Vl + j]);
  CKPT_RETURN_IF_ERROR(comm->all_reduce_max<T>(mx.data(), n));
  // red[i] = sum of exponentials of row i, red[n + i] = its target logit (on the holding rank).
  std::vector<double> red(static_cast<size_t>(2 * n), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const T* lr = logits + i * Vl;
    double sum = 0;
    for (int64_t j = 0; j < Vl; ++j) sum += std::exp(lr[j] - mx[i]);
    red[i] = sum;
    if (r.holds(targets[i])) red[n + i] = static_cast<double>(lr[targets[i] - r.begin]);
  }
  CKPT_RETURN_IF_ERROR(comm->all_reduce_sum<double>(red.data(), 2 * n));
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    total += static_cast<double>(mx[i]) + std::log(red[i]) - red[n + i];
    if (!dlogits) continue;
    const T* lr = logits + i * Vl;
    T* dr = dlogits + i * Vl;
    const T inv = static_cast<T>(1.0 / red[i]);
    for (int64_t j = 0; j < Vl; ++j) dr[j] = std::exp(lr[j] - mx[i]) * inv * scale;
    if (r.holds(targets[i])) dr[targets[i] - r.begin] -= scale;
  }
  return total;
}

#define CKPT_INSTANTIATE_TP_OPS(T)                                                                          \
  template Status vocab_parallel_embedding<T>(const T*, VocabRange, const int32_t*, int64_t, int64_t, T*,   \
                                              Comm*);                                                       \
  template void vocab_parallel_embedding_backward<T>(T*, VocabRange, const int32_t*, int64_t, int64_t,      \
                                                     const T*);                                             \
  template Result<double> vocab_parallel_cross_entropy<T>(const T*, VocabRange, const int32_t*, T*, int64_t, \
                                                          T, Comm*);
CKPT_INSTANTIATE_TP_OPS(float)
CKPT_INSTANTIATE_TP_OPS(double)
#undef CKPT_INSTANTIATE_TP_OPS

}  // namespace ckpt::trainer
