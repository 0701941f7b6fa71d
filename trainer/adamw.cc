#include "trainer/adamw.h"

#include <cmath>

namespace ckpt::trainer {

void AdamW::add(std::string name, Shape shape, Region region, float* w, float* g, int64_t n,
                bool decay) {
  OptSlot s;
  s.name = std::move(name);
  s.shape = std::move(shape);
  s.region = std::move(region);
  s.w = w;
  s.g = g;
  s.n = n;
  s.decay = decay;
  s.exp_avg.assign(static_cast<size_t>(n), 0.0f);
  s.exp_avg_sq.assign(static_cast<size_t>(n), 0.0f);
  slots_.push_back(std::move(s));
}

OptSlot* AdamW::find(const std::string& name) {
  for (auto& s : slots_)
    if (s.name == name) return &s;
  return nullptr;
}

void AdamW::step(double lr, int64_t step) {
  // Scalars as torch computes them: Python floats (double), cast to float at the tensor op.
  const float decay_mul = static_cast<float>(1.0 - lr * opt_.weight_decay);
  const float w1 = static_cast<float>(1.0 - opt_.beta1);
  const float b2 = static_cast<float>(opt_.beta2);
  const float w2 = static_cast<float>(1.0 - opt_.beta2);
  const double bc1 = 1.0 - std::pow(opt_.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(opt_.beta2, static_cast<double>(step));
  const float neg_step_size = static_cast<float>(-(lr / bc1));
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float eps = static_cast<float>(opt_.eps);
  for (auto& s : slots_) {
    float* w = s.w;
    const float* g = s.g;
    float* m = s.exp_avg.data();
    float* v = s.exp_avg_sq.data();
    const bool wd = s.decay && opt_.weight_decay != 0.0;
    for (int64_t i = 0; i < s.n; ++i) {
      if (wd) w[i] = w[i] * decay_mul;
      m[i] = m[i] + w1 * (g[i] - m[i]);  // torch lerp, weight < 0.5
      v[i] = v[i] * b2;
      v[i] = v[i] + w2 * g[i] * g[i];
      const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
      w[i] = w[i] + neg_step_size * m[i] / denom;
    }
  }
}

double AdamW::grad_sq_sum() const {
  double t = 0;
  for (const auto& s : slots_)
    for (int64_t i = 0; i < s.n; ++i) t += static_cast<double>(s.g[i]) * s.g[i];
  return t;
}

float AdamW::clip_coef(double norm, double max_norm) {
  const double c = max_norm / (norm + 1e-6);
  return static_cast<float>(c < 1.0 ? c : 1.0);
}

void AdamW::scale_grads(float coef) {
  for (auto& s : slots_)
    for (int64_t i = 0; i < s.n; ++i) s.g[i] *= coef;
}

}  // namespace ckpt::trainer
