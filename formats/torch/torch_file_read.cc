// TorchFile::read_tensor: a sub-box of a strided tensor, dense row-major, from its storage.
// The innermost dimensions whose elements are consecutive in the storage form one run read as a
// single range; a strided tensor with short runs (e.g. transposed) is read as the one storage span
// it covers and gathered in memory when that span is not much larger than the result.
#include <algorithm>
#include <cstring>
#include <vector>

#include "formats/base/checked.h"
#include "formats/torch/torch_file.h"

namespace ckpt::torch {

namespace {

constexpr uint64_t kTorchShortRunBytes = 4096;
constexpr uint64_t kTorchGatherSpanMin = 64ull << 20;  // always gather when the span is below this

struct TorchReadRunPlan {
  size_t outer = 0;      // dimensions [0, outer) are iterated; [outer, ndim) form one run
  int64_t run = 1;       // elements per run
  int64_t first = 0;     // storage element of the sub-box's first element
  int64_t span_end = 0;  // one past the last storage element the sub-box touches
};

TorchReadRunPlan torch_plan_runs(const TensorRef& t, const Box& sub) {
  TorchReadRunPlan p;
  size_t nd = t.size.size();
  p.outer = nd;
  for (size_t d = nd; d-- > 0;) {
    if (sub.extent[d] == 1) {
      p.outer = d;
      continue;
    }
    if (t.stride[d] != p.run) break;
    p.run *= sub.extent[d];
    p.outer = d;
  }
  p.first = t.storage_offset;
  p.span_end = t.storage_offset;
  for (size_t d = 0; d < nd; ++d) {
    p.first += sub.offset[d] * t.stride[d];
    p.span_end += (sub.offset[d] + sub.extent[d] - 1) * t.stride[d];
  }
  p.span_end += 1;
  return p;
}

// Calls fn(storage_element, out_element) for each run, in row-major order of the sub-box.
template <typename Fn>
Status torch_for_each_run(const TensorRef& t, const Box& sub, const TorchReadRunPlan& p, Fn&& fn) {
  std::vector<int64_t> idx(p.outer, 0);
  int64_t out = 0;
  while (true) {
    int64_t at = p.first;
    for (size_t d = 0; d < p.outer; ++d) at += idx[d] * t.stride[d];
    CKPT_RETURN_IF_ERROR(fn(at, out));
    out += p.run;
    size_t d = p.outer;
    while (d > 0) {
      --d;
      if (++idx[d] < sub.extent[d]) break;
      idx[d] = 0;
      if (d == 0) return Status::Ok();
    }
    if (p.outer == 0) return Status::Ok();
  }
}

}  // namespace

Status TorchFile::read_tensor(const TensorRef& t, const Box& sub, void* dst) {
  Status v = validate_box(sub, t.size);
  if (!v.ok())
    return Status::Error("TorchReadRange", "torch file: read of tensor over storage '" + t.storage.key + "': " + v.message()).with_file(path());
  if (t.stride.size() != t.size.size())
    return Status::Error("TorchReadRange", "torch file: tensor size and stride differ in length").with_file(path());
  if (sub.numel() == 0) return Status::Ok();
  const uint64_t es = dtype_size(t.storage.dtype);
  TorchReadRunPlan p = torch_plan_runs(t, sub);
  auto* out = static_cast<char*>(dst);
  const uint64_t run_bytes = static_cast<uint64_t>(p.run) * es;
  const uint64_t out_bytes = static_cast<uint64_t>(sub.numel()) * es;
  const uint64_t span_bytes = static_cast<uint64_t>(p.span_end - p.first) * es;
  if (run_bytes < kTorchShortRunBytes && sub.numel() > p.run && span_bytes <= std::max(kTorchGatherSpanMin, 2 * out_bytes)) {
    std::vector<char> span(span_bytes);
    CKPT_RETURN_IF_ERROR(read_storage(t.storage.key, static_cast<uint64_t>(p.first) * es, span_bytes, span.data()));
    return torch_for_each_run(t, sub, p, [&](int64_t at, int64_t o) {
      std::memcpy(out + o * es, span.data() + (at - p.first) * es, run_bytes);
      return Status::Ok();
    });
  }
  return torch_for_each_run(t, sub, p, [&](int64_t at, int64_t o) {
    return read_storage(t.storage.key, static_cast<uint64_t>(at) * es, run_bytes, out + o * es);
  });
}

std::optional<FileExtent> TorchFile::tensor_extent(const TensorRef& t, const Box& sub) {
  if (!validate_box(sub, t.size).ok() || t.stride.size() != t.size.size() || sub.numel() == 0) return std::nullopt;
  const TorchReadRunPlan p = torch_plan_runs(t, sub);
  for (size_t d = 0; d < p.outer; ++d)
    if (sub.extent[d] != 1) return std::nullopt;  // more than one run
  const uint64_t es = dtype_size(t.storage.dtype);
  return storage_extent(t.storage.key, static_cast<uint64_t>(p.first) * es, static_cast<uint64_t>(p.run) * es);
}

}  // namespace ckpt::torch
