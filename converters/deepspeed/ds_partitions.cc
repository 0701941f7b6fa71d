#include "converters/deepspeed/ds_partitions.h"

#include <algorithm>

namespace ckpt {

namespace {

constexpr int64_t kDsMaxNumel = int64_t{1} << 62;

Status ds_layout_error(const char* code, const std::string& msg) { return Status::Error(code, msg); }

Result<int64_t> ds_param_numel(const DsParamShape& p) {
  int64_t n = 1;
  for (int64_t d : p.shape) {
    if (d < 0 || (d > 0 && n > kDsMaxNumel / d))
      return ds_layout_error("DeepSpeedParamShape", "parameter '" + p.name + "' has shape " + shape_to_string(p.shape) +
                                                     " (a negative dimension or more than 2^62 elements)");
    n *= d;
  }
  return n;
}

}  // namespace

Result<std::vector<DsParamLayout>> ds_zero12_layout(const std::vector<std::vector<DsParamShape>>& groups,
                                                   const std::vector<std::vector<int64_t>>& partition_numel,
                                                   const std::vector<std::vector<int64_t>>& group_paddings,
                                                   const std::vector<std::vector<int64_t>>& alignment_paddings, int* failed_rank) {
  int ignored = -1;
  int& bad = failed_rank ? *failed_rank : ignored;
  auto rank_error = [&bad](int r, const char* code, const std::string& msg) {  // an error about rank r's sizes
    bad = r;
    return ds_layout_error(code, msg);
  };
  const int world = static_cast<int>(partition_numel.size());
  if (world < 1) return ds_layout_error("DeepSpeedPartitionCount", "no rank partitions");
  const size_t G = groups.size();
  if (group_paddings.size() != partition_numel.size())
    return ds_layout_error("DeepSpeedPadding", "group_paddings of " + std::to_string(group_paddings.size()) + " ranks for " + std::to_string(world));
  for (int r = 0; r < world; ++r) {
    if (partition_numel[r].size() != G)
      return rank_error(r, "DeepSpeedPartitionCount", "rank " + std::to_string(r) + " holds " + std::to_string(partition_numel[r].size()) +
                                                         " fp32 partitions, param_shapes lists " + std::to_string(G) + " param groups");
    if (group_paddings[r].size() != G)
      return rank_error(r, "DeepSpeedPadding", "rank " + std::to_string(r) + "'s group_paddings lists " + std::to_string(group_paddings[r].size()) +
                                                  " groups, param_shapes " + std::to_string(G));
  }
  if (!alignment_paddings.empty() && alignment_paddings.size() != G)
    return ds_layout_error("DeepSpeedPadding", "param_alignment_paddings lists " + std::to_string(alignment_paddings.size()) +
                                                " groups, param_shapes " + std::to_string(G));
  std::vector<DsParamLayout> out;
  for (size_t g = 0; g < G; ++g) {
    const std::string gname = "param group " + std::to_string(g);
    // Rank r's partition as saved: the padded partition P (one size on every rank: the largest
    // saved one, a rank without padding) less its padding.
    int64_t padded = 0;
    for (int r = 0; r < world; ++r) padded = std::max(padded, partition_numel[r][g]);
    std::vector<int64_t> begin{0};  // of each rank's partition in the group's concatenation
    for (int r = 0; r < world; ++r) {
      const int64_t part = partition_numel[r][g], pad = group_paddings[r][g];
      if (part < 0 || part > kDsMaxNumel / world)
        return rank_error(r, "DeepSpeedPartitionSize",
                          gname + ": rank " + std::to_string(r) + "'s fp32 partition holds " + std::to_string(part) + " elements");
      if (pad < 0 || pad > padded)
        return rank_error(r, "DeepSpeedPadding", gname + ": rank " + std::to_string(r) + "'s group_paddings says " + std::to_string(pad) +
                                                    " elements, more than a partition of the group holds (" + std::to_string(padded) + ")");
      if (part + pad != padded)
        return rank_error(r, "DeepSpeedPartitionSize", gname + ": rank " + std::to_string(r) + "'s fp32 partition holds " + std::to_string(part) +
                                                          " elements + " + std::to_string(pad) + " padding, the group's partitions " +
                                                          std::to_string(padded) + " (ZeRO partitions of a group are of one size)");
      begin.push_back(begin.back() + part);
    }
    const int64_t total = begin.back();
    if (!alignment_paddings.empty() && alignment_paddings[g].size() != groups[g].size())
      return ds_layout_error("DeepSpeedPadding", gname + ": param_alignment_paddings lists " + std::to_string(alignment_paddings[g].size()) +
                                                  " paddings for " + std::to_string(groups[g].size()) + " parameters");
    int64_t offset = 0;
    for (size_t k = 0; k < groups[g].size(); ++k) {
      const DsParamShape& p = groups[g][k];
      CKPT_ASSIGN_OR_RETURN(int64_t n, ds_param_numel(p));
      if (n > total - offset)
        return ds_layout_error("DeepSpeedGroupSize", gname + ": parameter '" + p.name + "' (" + std::to_string(n) + " elements at " +
                                                      std::to_string(offset) + ") runs past the " + std::to_string(total) +
                                                      " elements the ranks' partitions hold");
      DsParamLayout l{p.name, p.shape, n, {}};
      int64_t at = offset, pb = 0, left = n;
      while (left > 0) {  // split at the ranks' partition boundaries
        const int r = static_cast<int>(std::upper_bound(begin.begin(), begin.end(), at) - begin.begin()) - 1;
        const int64_t take = std::min(left, begin[r + 1] - at);
        l.segments.push_back({r, static_cast<int>(g), at - begin[r], pb, take});
        at += take, pb += take, left -= take;
      }
      out.push_back(std::move(l));
      offset += n;
      if (!alignment_paddings.empty()) {
        const int64_t a = alignment_paddings[g][k];
        if (a < 0 || a > total - offset)
          return ds_layout_error("DeepSpeedPadding", gname + ": param_alignment_paddings of '" + p.name + "' is " + std::to_string(a));
        offset += a;
      }
    }
    if (offset != total)
      return ds_layout_error("DeepSpeedGroupSize", gname + ": its parameters take " + std::to_string(offset) +
                                                       " elements, but the ranks' partitions hold " + std::to_string(total) + " (" +
                                                       std::to_string(world) + " partitions of " + std::to_string(padded) +
                                                       " less their group_paddings)");
  }
  return out;
}

Result<std::vector<DsParamLayout>> ds_zero3_layout(const std::vector<DsParamShape>& params,
                                                  const std::vector<std::vector<int64_t>>& flat_numel, int* failed_rank) {
  int ignored = -1;
  int& bad = failed_rank ? *failed_rank : ignored;
  auto rank_error = [&bad](int r, const char* code, const std::string& msg) {  // an error about rank r's sizes
    bad = r;
    return ds_layout_error(code, msg);
  };
  const int world = static_cast<int>(flat_numel.size());
  if (world < 1) return ds_layout_error("DeepSpeedPartitionCount", "no rank partitions");
  const std::vector<int64_t>& g0 = flat_numel[0];
  std::vector<int64_t> group_begin{0};  // of each group in a rank's concatenated groups
  for (int64_t n : g0) {
    if (n < 0 || n > kDsMaxNumel - group_begin.back()) return ds_layout_error("DeepSpeedPartitionSize", "rank 0's flat groups exceed 2^62 elements");
    group_begin.push_back(group_begin.back() + n);
  }
  for (int r = 1; r < world; ++r) {
    if (flat_numel[r].size() != g0.size())
      return rank_error(r, "DeepSpeedPartitionCount", "rank " + std::to_string(r) + " holds " + std::to_string(flat_numel[r].size()) +
                                                         " fp32 flat groups, rank 0 " + std::to_string(g0.size()));
    for (size_t g = 0; g < g0.size(); ++g)
      if (flat_numel[r][g] != g0[g])
        return rank_error(r, "DeepSpeedPartitionSize", "rank " + std::to_string(r) + "'s fp32 flat group " + std::to_string(g) + " holds " +
                                                          std::to_string(flat_numel[r][g]) + " elements, rank 0's " + std::to_string(g0[g]) +
                                                          " (ZeRO-3 partitions are of one size)");
  }
  const int64_t avail = group_begin.back();
  std::vector<DsParamLayout> out;
  int64_t offset = 0;  // in a rank's concatenated groups
  for (const DsParamShape& p : params) {
    CKPT_ASSIGN_OR_RETURN(int64_t n, ds_param_numel(p));
    const int64_t part = (n + world - 1) / world;
    if (part > avail - offset)
      return ds_layout_error("DeepSpeedGroupSize", "parameter '" + p.name + "' (" + std::to_string(n) + " elements, " + std::to_string(part) +
                                                    " per rank at " + std::to_string(offset) + ") runs past each rank's " +
                                                    std::to_string(avail) + " flat elements");
    DsParamLayout l{p.name, p.shape, n, {}};
    for (int r = 0; r < world; ++r) {
      int64_t pb = r * part;
      int64_t left = std::min(part, n - pb);  // the last ranks' pieces are shorter (padding)
      int64_t at = offset;
      while (left > 0) {
        const size_t g = static_cast<size_t>(std::upper_bound(group_begin.begin(), group_begin.end(), at) - group_begin.begin()) - 1;
        const int64_t take = std::min(left, group_begin[g + 1] - at);
        l.segments.push_back({r, static_cast<int>(g), at - group_begin[g], pb, take});
        at += take, pb += take, left -= take;
      }
    }
    out.push_back(std::move(l));
    offset += part;
  }
  if (offset != avail)
    return ds_layout_error("DeepSpeedGroupSize", "the parameters take " + std::to_string(offset) +
                                                      " elements of each rank's flat groups, which hold " + std::to_string(avail));
  return out;
}

Status ds_for_each_flat_run(const Shape& shape, const Box& sub,
                         const std::function<Status(int64_t flat_begin, int64_t out_begin, int64_t count)>& fn) {
  CKPT_RETURN_IF_ERROR(validate_box(sub, shape));
  const size_t nd = shape.size();
  if (sub.numel() == 0) return Status::Ok();
  // Dimensions [outer, nd) form one run: trailing dims taken whole, then one partial.
  size_t outer = nd;
  int64_t run = 1;
  while (outer > 0) {
    const size_t d = outer - 1;
    run *= sub.extent[d];
    outer = d;
    if (sub.extent[d] != shape[d]) break;
  }
  std::vector<int64_t> stride(nd, 1);
  for (size_t d = nd; d-- > 1;) stride[d - 1] = stride[d] * shape[d];
  std::vector<int64_t> idx(outer, 0);
  int64_t out = 0;
  while (true) {
    int64_t flat = 0;
    for (size_t d = 0; d < nd; ++d) flat += (sub.offset[d] + (d < outer ? idx[d] : 0)) * stride[d];
    CKPT_RETURN_IF_ERROR(fn(flat, out, run));
    out += run;
    size_t d = outer;
    while (d > 0) {
      --d;
      if (++idx[d] < sub.extent[d]) break;
      idx[d] = 0;
      if (d == 0) return Status::Ok();
    }
    if (outer == 0) return Status::Ok();
  }
}

}  // namespace ckpt
