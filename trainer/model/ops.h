// Numeric kernels of the reference LLaMA trainer, written by hand, forward and backward:
// GEMM (OpenBLAS cblas_sgemm / cblas_dgemm), RMSNorm, RoPE (HF rotate-half), causal GQA attention,
// SwiGLU, embedding and cross-entropy. Templated on the element type (float for training, double
// for finite-difference checks). Buffers are dense row-major; shapes are given in comments.
// Thread safety: pure functions on caller buffers; concurrent calls on disjoint buffers are safe.
#pragma once

#include <cstdint>
#include <vector>

namespace ckpt::trainer {

// Sets the number of OpenBLAS threads (the only multi-threaded part of the trainer's compute).
void set_blas_threads(int n);
int blas_threads();

// C[M, N] = alpha * op(A) * op(B) + beta * C, row-major. op(A) is [M, K]: A is [M, K] (lda) or,
// when trans_a, [K, M]. op(B) is [K, N]: B is [K, N] (ldb) or, when trans_b, [N, K].
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// y[n, out] = x[n, in] * W[out, in]^T  (HF nn.Linear without bias); y is overwritten.
template <class T>
void linear_forward(const T* x, const T* W, T* y, int64_t n, int64_t in, int64_t out);
// dx[n, in] (+)= dy[n, out] * W[out, in]   (accumulate_dx: += instead of =; dx may be null)
// dW[out, in] += dy[n, out]^T * x[n, in]
template <class T>
void linear_backward(const T* x, const T* W, const T* dy, T* dx, bool accumulate_dx, T* dW,
                     int64_t n, int64_t in, int64_t out);

// HF LlamaRMSNorm: y = w * (x * rstd), rstd = 1/sqrt(mean(x^2) + eps), per row.
// x, y: [n, d]; w: [d]; rstd: [n] (saved for backward).
template <class T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t n, int64_t d, double eps);
// dx[n, d] += d(loss)/dx (accumulates: the residual gradient is already in dx); dw[d] +=.
template <class T>
void rmsnorm_backward(const T* x, const T* w, const T* rstd, const T* dy, T* dx, T* dw, int64_t n,
                      int64_t d);

// RoPE tables for positions 0..seq-1: cos, sin are [seq, hd/2] (HF: inv_freq_j =
// 1/theta^(2j/hd), angle = pos * inv_freq_j, computed like HF in fp32 then cos/sin).
template <class T>
void rope_tables(int64_t seq, int64_t hd, double theta, std::vector<T>& cos, std::vector<T>& sin);
// In-place rotate-half RoPE on x [b*seq, heads*hd] (row r has position r % seq). inverse=true
// applies the transposed rotation (the backward of the forward).
template <class T>
void rope_apply(T* x, int64_t rows, int64_t seq, int64_t heads, int64_t hd, const T* cos,
                const T* sin, bool inverse);

// Causal softmax attention with GQA: query head h uses kv group h / (H / K).
// q [b*seq, H*hd], k, v [b*seq, K*hd] -> out [b*seq, H*hd]; probs [b, H, seq, seq] saved
// (entries above the diagonal are 0). Scores are scaled by 1/sqrt(hd).
template <class T>
void attention_forward(const T* q, const T* k, const T* v, T* probs, T* out, int64_t b,
                       int64_t seq, int64_t H, int64_t K, int64_t hd);
// dq [b*seq, H*hd] overwritten; dk, dv [b*seq, K*hd] overwritten. scratch: >= seq*seq elements.
template <class T>
void attention_backward(const T* q, const T* k, const T* v, const T* probs, const T* dout, T* dq,
                        T* dk, T* dv, T* scratch, int64_t b, int64_t seq, int64_t H, int64_t K,
                        int64_t hd);

// SwiGLU: h = silu(g) * u, all [n] (flattened).
template <class T>
void swiglu_forward(const T* g, const T* u, T* h, int64_t n);
// dg, du [n] overwritten.
template <class T>
void swiglu_backward(const T* g, const T* u, const T* dh, T* dg, T* du, int64_t n);

// Cross-entropy of logits [n, V] against targets [n] (each in [0, V)). Returns the SUM of the
// per-token losses (as double). If dlogits is non-null it receives scale * d(sum)/d(logits)
// ([n, V], may alias logits).
template <class T>
double cross_entropy(const T* logits, const int32_t* targets, T* dlogits, int64_t n, int64_t V,
                     T scale);

}  // namespace ckpt::trainer
