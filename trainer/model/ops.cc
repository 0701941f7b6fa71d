#include "trainer/model/ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace ckpt::trainer {

void set_blas_threads(int n) { openblas_set_num_threads(n < 1 ? 1 : n); }
int blas_threads() { return openblas_get_num_threads(); }

template <>
void gemm<float>(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                 int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(M), static_cast<blasint>(N), static_cast<blasint>(K), alpha, A,
              static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C,
              static_cast<blasint>(ldc));
}

template <>
void gemm<double>(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
                  int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(M), static_cast<blasint>(N), static_cast<blasint>(K), alpha, A,
              static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C,
              static_cast<blasint>(ldc));
}

template <class T>
void linear_forward(const T* x, const T* W, T* y, int64_t n, int64_t in, int64_t out) {
  // y[n, out] = x[n, in] * W[out, in]^T
  gemm<T>(false, true, n, out, in, T(1), x, in, W, in, T(0), y, out);
}

template <class T>
void linear_backward(const T* x, const T* W, const T* dy, T* dx, bool accumulate_dx, T* dW,
                     int64_t n, int64_t in, int64_t out) {
  // dx[n, in] = dy[n, out] * W[out, in]
  if (dx) gemm<T>(false, false, n, in, out, T(1), dy, out, W, in, accumulate_dx ? T(1) : T(0), dx, in);
  // dW[out, in] += dy[n, out]^T * x[n, in]
  if (dW) gemm<T>(true, false, out, in, n, T(1), dy, out, x, in, T(1), dW, in);
}

template <class T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t n, int64_t d, double eps) {
  for (int64_t r = 0; r < n; ++r) {
    const T* xr = x + r * d;
    T* yr = y + r * d;
    double ss = 0;  // reductions accumulate in double (cheap next to the GEMMs)
    for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(xr[j]) * xr[j];
    const T rs = static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
    rstd[r] = rs;
    for (int64_t j = 0; j < d; ++j) yr[j] = w[j] * (xr[j] * rs);
  }
}

template <class T>
void rmsnorm_backward(const T* x, const T* w, const T* rstd, const T* dy, T* dx, T* dw, int64_t n,
                      int64_t d) {
  // xhat = x * rs; y = w * xhat. dxhat = dy * w.
  // dx = rs * (dxhat - xhat * mean(dxhat * xhat)); dw += sum_rows dy * xhat.
  for (int64_t r = 0; r < n; ++r) {
    const T* xr = x + r * d;
    const T* dyr = dy + r * d;
    T* dxr = dx + r * d;
    const T rs = rstd[r];
    double dot = 0;
    for (int64_t j = 0; j < d; ++j) {
      const T xhat = xr[j] * rs;
      dot += static_cast<double>(dyr[j] * w[j]) * xhat;
      dw[j] += dyr[j] * xhat;
    }
    const T m = static_cast<T>(dot / static_cast<double>(d));
    for (int64_t j = 0; j < d; ++j) dxr[j] += rs * (dyr[j] * w[j] - xr[j] * rs * m);
  }
}

template <class T>
void rope_tables(int64_t seq, int64_t hd, double theta, std::vector<T>& cos, std::vector<T>& sin) {
  const int64_t half = hd / 2;
  cos.assign(static_cast<size_t>(seq * half), T(0));
  sin.assign(static_cast<size_t>(seq * half), T(0));
  for (int64_t j = 0; j < half; ++j) {
    // As HF computes it: fp32 exponent and inverse frequency, fp32 angle.
    const float expo = static_cast<float>(2 * j) / static_cast<float>(hd);
    const float inv = 1.0f / std::pow(static_cast<float>(theta), expo);
    for (int64_t p = 0; p < seq; ++p) {
      const float ang = static_cast<float>(p) * inv;
      cos[static_cast<size_t>(p * half + j)] = static_cast<T>(std::cos(static_cast<double>(ang)));
      sin[static_cast<size_t>(p * half + j)] = static_cast<T>(std::sin(static_cast<double>(ang)));
    }
  }
}

template <class T>
void rope_apply(T* x, int64_t rows, int64_t seq, int64_t heads, int64_t hd, const T* cos,
                const T* sin, bool inverse) {
  // out[j] = x[j] c - x[j+half] s ; out[j+half] = x[j+half] c + x[j] s  (rotate_half)
  // inverse (transpose): out[j] = x[j] c + x[j+half] s ; out[j+half] = x[j+half] c - x[j] s
  const int64_t half = hd / 2;
  const T sgn = inverse ? T(-1) : T(1);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t p = r % seq;
    const T* c = cos + p * half;
    const T* s = sin + p * half;
    for (int64_t h = 0; h < heads; ++h) {
      T* v = x + r * heads * hd + h * hd;
      for (int64_t j = 0; j < half; ++j) {
        const T a = v[j], b = v[j + half];
        const T sj = sgn * s[j];
        v[j] = a * c[j] - b * sj;
        v[j + half] = b * c[j] + a * sj;
      }
    }
  }
}

template <class T>
void attention_forward(const T* q, const T* k, const T* v, T* probs, T* out, int64_t b,
                       int64_t seq, int64_t H, int64_t K, int64_t hd) {
  const int64_t group = H / K;
  const T scale = T(1) / std::sqrt(T(hd));
  const int64_t qs = H * hd, ks = K * hd;  // row strides
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / group;
      const T* qb = q + bi * seq * qs + h * hd;  // [seq, hd] stride qs
      const T* kb = k + bi * seq * ks + g * hd;  // [seq, hd] stride ks
      const T* vb = v + bi * seq * ks + g * hd;
      T* P = probs + (bi * H + h) * seq * seq;  // [seq, seq]
      // S = q k^T (unscaled), then scale inside the softmax like HF (matmul * scaling).
      gemm<T>(false, true, seq, seq, hd, T(1), qb, qs, kb, ks, T(0), P, seq);
      for (int64_t t = 0; t < seq; ++t) {
        T* row = P + t * seq;
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t s = 0; s <= t; ++s) {
          row[s] *= scale;
          mx = std::max(mx, row[s]);
        }
        double sum = 0;
        for (int64_t s = 0; s <= t; ++s) {
          row[s] = std::exp(row[s] - mx);
          sum += row[s];
        }
        const T inv = static_cast<T>(1.0 / sum);
        for (int64_t s = 0; s <= t; ++s) row[s] *= inv;
        for (int64_t s = t + 1; s < seq; ++s) row[s] = T(0);
      }
      // out_bh[seq, hd] = P[seq, seq] v[seq, hd]
      gemm<T>(false, false, seq, hd, seq, T(1), P, seq, vb, ks, T(0), out + bi * seq * qs + h * hd,
              qs);
    }
  }
}

template <class T>
void attention_backward(const T* q, const T* k, const T* v, const T* probs, const T* dout, T* dq,
                        T* dk, T* dv, T* scratch, int64_t b, int64_t seq, int64_t H, int64_t K,
                        int64_t hd) {
  const int64_t group = H / K;
  const T scale = T(1) / std::sqrt(T(hd));
  const int64_t qs = H * hd, ks = K * hd;
  std::fill(dk, dk + b * seq * ks, T(0));
  std::fill(dv, dv + b * seq * ks, T(0));
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / group;
      const T* qb = q + bi * seq * qs + h * hd;
      const T* kb = k + bi * seq * ks + g * hd;
      const T* vb = v + bi * seq * ks + g * hd;
      const T* dob = dout + bi * seq * qs + h * hd;
      const T* P = probs + (bi * H + h) * seq * seq;
      T* dP = scratch;  // [seq, seq]
      // dv_g[seq, hd] += P^T dout
      gemm<T>(true, false, seq, hd, seq, T(1), P, seq, dob, qs, T(1), dv + bi * seq * ks + g * hd, ks);
      // dP = dout v^T
      gemm<T>(false, true, seq, seq, hd, T(1), dob, qs, vb, ks, T(0), dP, seq);
      // dS = P * (dP - sum_s P dP) * scale
      for (int64_t t = 0; t < seq; ++t) {
        const T* pr = P + t * seq;
        T* dr = dP + t * seq;
        double dot = 0;
        for (int64_t s = 0; s <= t; ++s) dot += static_cast<double>(pr[s]) * dr[s];
        for (int64_t s = 0; s <= t; ++s) dr[s] = static_cast<T>(pr[s] * (dr[s] - dot) * scale);
        for (int64_t s = t + 1; s < seq; ++s) dr[s] = T(0);
      }
      // dq = dS k ; dk_g += dS^T q
      gemm<T>(false, false, seq, hd, seq, T(1), dP, seq, kb, ks, T(0), dq + bi * seq * qs + h * hd, qs);
      gemm<T>(true, false, seq, hd, seq, T(1), dP, seq, qb, qs, T(1), dk + bi * seq * ks + g * hd, ks);
    }
  }
}

template <class T>
void swiglu_forward(const T* g, const T* u, T* h, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T sg = T(1) / (T(1) + std::exp(-g[i]));
    h[i] = g[i] * sg * u[i];
  }
}

template <class T>
void swiglu_backward(const T* g, const T* u, const T* dh, T* dg, T* du, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T sg = T(1) / (T(1) + std::exp(-g[i]));
    const T silu = g[i] * sg;
    du[i] = dh[i] * silu;
    dg[i] = dh[i] * u[i] * sg * (T(1) + g[i] * (T(1) - sg));
  }
}

template <class T>
double cross_entropy(const T* logits, const int32_t* targets, T* dlogits, int64_t n, int64_t V,
                     T scale) {
  double total = 0;
  for (int64_t r = 0; r < n; ++r) {
    const T* lr = logits + r * V;
    T mx = lr[0];
    for (int64_t j = 1; j < V; ++j) mx = std::max(mx, lr[j]);
    double sum = 0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(lr[j] - mx);
    const double lse = static_cast<double>(mx) + std::log(sum);
    const int32_t tg = targets[r];
    total += lse - static_cast<double>(lr[tg]);
    if (dlogits) {
      T* dr = dlogits + r * V;
      const T inv = static_cast<T>(1.0 / sum);
      for (int64_t j = 0; j < V; ++j) dr[j] = std::exp(lr[j] - mx) * inv * scale;
      dr[tg] -= scale;
    }
  }
  return total;
}

#define CKPT_INSTANTIATE_OPS(T)                                                                  \
  template void linear_forward<T>(const T*, const T*, T*, int64_t, int64_t, int64_t);            \
  template void linear_backward<T>(const T*, const T*, const T*, T*, bool, T*, int64_t, int64_t, \
                                   int64_t);                                                     \
  template void rmsnorm_forward<T>(const T*, const T*, T*, T*, int64_t, int64_t, double);        \
  template void rmsnorm_backward<T>(const T*, const T*, const T*, const T*, T*, T*, int64_t,     \
                                    int64_t);                                                    \
  template void rope_tables<T>(int64_t, int64_t, double, std::vector<T>&, std::vector<T>&);      \
  template void rope_apply<T>(T*, int64_t, int64_t, int64_t, int64_t, const T*, const T*, bool); \
  template void attention_forward<T>(const T*, const T*, const T*, T*, T*, int64_t, int64_t,     \
                                     int64_t, int64_t, int64_t);                                 \
  template void attention_backward<T>(const T*, const T*, const T*, const T*, const T*, T*, T*,  \
                                      T*, T*, int64_t, int64_t, int64_t, int64_t, int64_t);      \
  template void swiglu_forward<T>(const T*, const T*, T*, int64_t);                              \
  template void swiglu_backward<T>(const T*, const T*, const T*, T*, T*, int64_t);               \
  template double cross_entropy<T>(const T*, const int32_t*, T*, int64_t, int64_t, T);

CKPT_INSTANTIATE_OPS(float)
CKPT_INSTANTIATE_OPS(double)

}  // namespace ckpt::trainer
