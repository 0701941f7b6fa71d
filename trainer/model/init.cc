#include "trainer/model/init.h"

#include <cmath>
#include <numbers>

#include "converters/model/llama_config.h"

namespace ckpt::trainer {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

InitValues::InitValues(uint64_t seed, const std::string& name) {
  if (llama_is_norm(name)) kind_ = 1;
  else if (name.ends_with(".bias")) kind_ = 2;
  else key_ = splitmix64(seed ^ splitmix64(fnv1a64(name)));
}

double InitValues::operator()(uint64_t flat_index) const {
  if (kind_ == 1) return 1.0;
  if (kind_ == 2) return 0.0;
  const uint64_t a = splitmix64(key_ + 2 * flat_index);
  const uint64_t b = splitmix64(key_ + 2 * flat_index + 1);
  // u1 in (0, 1], u2 in [0, 1): 53-bit uniforms.
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;
  return kInitStd * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

double init_value(uint64_t seed, const std::string& name, uint64_t flat_index) {
  return InitValues(seed, name)(flat_index);
}

template <class T>
Status init_box(uint64_t seed, const std::string& name, const Shape& global_shape, const Box& box,
                T* dst) {
  CKPT_RETURN_IF_ERROR(validate_box(box, global_shape));
  const size_t nd = global_shape.size();
  const int64_t n = box.numel();
  if (n == 0) return Status::Ok();
  const InitValues value(seed, name);
  if (nd == 0) {
    dst[0] = static_cast<T>(value(0));
    return Status::Ok();
  }
  // Row-major strides of the global tensor.
  std::vector<uint64_t> stride(nd, 1);
  for (size_t d = nd - 1; d > 0; --d) stride[d - 1] = stride[d] * static_cast<uint64_t>(global_shape[d]);
  std::vector<int64_t> idx(nd, 0);  // index inside the box
  const int64_t inner = box.extent[nd - 1];
  int64_t out = 0;
  while (true) {
    uint64_t base = 0;
    for (size_t d = 0; d < nd; ++d) base += static_cast<uint64_t>(box.offset[d] + idx[d]) * stride[d];
    for (int64_t j = 0; j < inner; ++j) dst[out++] = static_cast<T>(value(base + static_cast<uint64_t>(j)));
    // advance all but the last dimension
    size_t d = nd - 1;
    while (d > 0) {
      --d;
      if (++idx[d] < box.extent[d]) break;
      idx[d] = 0;
      if (d == 0) return Status::Ok();
    }
    if (nd == 1) return Status::Ok();
  }
}

template Status init_box<float>(uint64_t, const std::string&, const Shape&, const Box&, float*);
template Status init_box<double>(uint64_t, const std::string&, const Shape&, const Box&, double*);

}  // namespace ckpt::trainer
