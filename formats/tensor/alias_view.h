// AliasView: a TensorSource whose tensors are boxes of another source's tensors, renamed and
// reshaped by unit dimensions. It turns naming conventions into box arithmetic: one expert's
// `experts.3.w1.weight` [F, D] is the box [3:4, 0:F, 0:D] of the stacked `experts.gate_proj.weight`
// [E, F, D] (and the other way round), a fused `gate_up_proj` [E, 2F, D] holds gate in [:, 0:F, :]
// and up in [:, F:2F, :]. Reads are forwarded with the box translated; no byte is copied here.
//
// Rules (named errors, kInvalidArgument "BadAlias" naming the view tensor):
// - an alias's view tensor is one of the view's tensors, its source tensor one of the inner's;
// - both boxes lie inside their tensors, and their extents are equal once dimensions of extent 1
//   are dropped (so row-major order is the same on both sides);
// - the aliases of a view tensor are disjoint and cover it;
// - the view tensor's dtype is the source tensor's.
// An inner piece stored as a flat range (ZeRO) cannot be aliased: Unsupported naming it.
// Thread safety: as the inner source (reads forward to it).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "formats/base/status.h"
#include "formats/tensor/region.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt {

struct TensorAlias {
  std::string view;  // the view's tensor
  Box view_box;      // its elements ...
  std::string src;   // ... are these of the inner source's tensor
  Box src_box;
};

// `inner` must outlive the view. `tensors` are the view's tensors, in the view's order.
Result<std::unique_ptr<TensorSource>> make_alias_view(TensorSource& inner, std::vector<TensorMeta> tensors,
                                                      std::vector<TensorAlias> aliases);
// The same view owning its inner source.
Result<std::unique_ptr<TensorSource>> make_alias_view(std::unique_ptr<TensorSource> inner, std::vector<TensorMeta> tensors,
                                                      std::vector<TensorAlias> aliases);

}  // namespace ckpt
