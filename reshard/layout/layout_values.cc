#include "reshard/layout/layout_values.h"

#include "formats/base/int_list.h"

namespace ckpt {

Result<Layout> LayoutValues::make(int64_t num_layers) const {
  if (tp < 1 || pp < 1 || dp < 1)
    return Status::InvalidArgument("layout flags: give --tp N --pp N --dp N (each >= 1), optionally --pp-layers and --zero");
  CKPT_ASSIGN_OR_RETURN(Layout l, Layout::make(tp, pp, dp, zero < 0 ? 0 : zero, static_cast<int>(num_layers), pp_layers));
  if (ep > 0 || etp > 0) {
    l.ep = ep > 0 ? ep : 1;
    l.etp = etp;
    CKPT_RETURN_IF_ERROR(l.validate());
  }
  return l;
}

Result<LayoutValues> LayoutValues::parse(int tp, int pp, int dp, int zero, const std::string& pp_layers) {
  LayoutValues v;
  v.tp = tp;
  v.pp = pp;
  v.dp = dp;
  v.zero = zero;
  if (!pp_layers.empty()) {
    CKPT_ASSIGN_OR_RETURN(v.pp_layers, parse_int_list(pp_layers, "--pp-layers"));
  }
  return v;
}

}  // namespace ckpt
