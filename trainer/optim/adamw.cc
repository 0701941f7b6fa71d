#include "trainer/optim/adamw.h"

#include <cmath>
#include <cstdio>

namespace ckpt::trainer {

namespace {

std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

}  // namespace

std::string adamw_out_of_range(const AdamWOptions& o, const std::string& prefix) {
  auto beta = [&](const char* name, double v) -> std::string {
    if (v >= 0 && v < 1) return "";
    return prefix + name + " = " + num(v) + " (expected in [0, 1))";
  };
  if (std::string e = beta("beta1", o.beta1); !e.empty()) return e;
  if (std::string e = beta("beta2", o.beta2); !e.empty()) return e;
  if (!(o.eps > 0 && o.eps <= kMaxAdamEps))
    return prefix + "eps = " + num(o.eps) + " (expected > 0 and at most " + num(kMaxAdamEps) + ")";
  if (!(o.weight_decay >= 0 && o.weight_decay <= kMaxWeightDecay))
    return prefix + "weight_decay = " + num(o.weight_decay) + " (expected >= 0 and at most " + num(kMaxWeightDecay) + ")";
  return "";
}

template <class T>
void BasicAdamW<T>::add(std::string name, Shape shape, Region region, T* w, T* g, int64_t n,
                        bool decay) {
  Slot s;
  s.name = std::move(name);
  s.shape = std::move(shape);
  s.region = std::move(region);
  s.w = w;
  s.g = g;
  s.n = n;
  s.decay = decay;
  s.exp_avg.assign(static_cast<size_t>(n), T(0));
  s.exp_avg_sq.assign(static_cast<size_t>(n), T(0));
  slots_.push_back(std::move(s));
}

template <class T>
typename BasicAdamW<T>::Slot* BasicAdamW<T>::find(const std::string& name) {
  for (auto& s : slots_)
    if (s.name == name) return &s;
  return nullptr;
}

template <class T>
void BasicAdamW<T>::step(double lr, int64_t step) {
  // Scalars as torch computes them: Python floats (double), cast to T at the tensor op.
  const T decay_mul = static_cast<T>(1.0 - lr * opt_.weight_decay);
  const T w1 = static_cast<T>(1.0 - opt_.beta1);
  const T b2 = static_cast<T>(opt_.beta2);
  const T w2 = static_cast<T>(1.0 - opt_.beta2);
  const double bc1 = 1.0 - std::pow(opt_.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(opt_.beta2, static_cast<double>(step));
  const T neg_step_size = static_cast<T>(-(lr / bc1));
  const T bc2_sqrt = static_cast<T>(std::sqrt(bc2));
  const T eps = static_cast<T>(opt_.eps);
  for (auto& s : slots_) {
    T* w = s.w;
    const T* g = s.g;
    T* m = s.exp_avg.data();
    T* v = s.exp_avg_sq.data();
    const bool wd = s.decay && opt_.weight_decay != 0.0;
    for (int64_t i = 0; i < s.n; ++i) {
      if (wd) w[i] = w[i] * decay_mul;
      m[i] = m[i] + w1 * (g[i] - m[i]);  // torch lerp, weight < 0.5
      v[i] = v[i] * b2;
      v[i] = v[i] + w2 * g[i] * g[i];
      // torch: denom = (v.sqrt() / bias_correction2_sqrt).add_(eps);
      //        p.addcdiv_(m, denom, value=-step_size) = p + (-step_size * m) / denom
      const T denom = std::sqrt(v[i]) / bc2_sqrt + eps;
      w[i] = w[i] + neg_step_size * m[i] / denom;
    }
  }
}

template <class T>
double BasicAdamW<T>::grad_sq_sum() const {
  double t = 0;
  for (const auto& s : slots_)
    for (int64_t i = 0; i < s.n; ++i) t += static_cast<double>(s.g[i]) * s.g[i];
  return t;
}

template <class T>
T BasicAdamW<T>::clip_coef(double norm, double max_norm) {
  const double c = max_norm / (norm + 1e-6);
  return static_cast<T>(c < 1.0 ? c : 1.0);
}

template <class T>
void BasicAdamW<T>::scale_grads(T coef) {
  for (auto& s : slots_)
    for (int64_t i = 0; i < s.n; ++i) s.g[i] *= coef;
}

template struct BasicOptSlot<float>;
template struct BasicOptSlot<double>;
template class BasicAdamW<float>;
template class BasicAdamW<double>;

}  // namespace ckpt::trainer
