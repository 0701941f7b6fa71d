#include "trainer/train_layout.h"

#include "converters/model/llama_sharding.h"
#include "reshard/layout/tensor_placement.h"

namespace ckpt::trainer {

namespace {

Status refuse(const std::string& msg) { return Status::Error("LayoutRefused", msg); }

Result<Layout> base_layout(const TrainLayoutFlags& f, const LlamaConfig& c) {
  const int64_t L = c.num_hidden_layers;
  if (!f.file.empty()) {
    if (f.values.given())
      return Status::InvalidArgument("--layout FILE excludes --tp, --pp, --pp-layers, --dp and --zero");
    return Layout::from_file(f.file);
  }
  if (!f.values.given()) return Layout::make(1, 1, 1, 0, static_cast<int>(L));
  LayoutValues v = f.values;  // unset parallel sizes default to 1 for training
  if (v.tp == 0) v.tp = 1;
  if (v.pp == 0) v.pp = 1;
  if (v.dp == 0) v.dp = 1;
  return v.make(L);
}

}  // namespace

int64_t global_batch(const Layout& layout, int64_t grad_accum) {
  int64_t sum = 0;
  for (int p = 0; p < layout.num_pipelines(); ++p) sum += layout.pipeline_micro_batch(p);
  return sum * grad_accum;
}

namespace {

Status set_batches(const TrainLayoutFlags& f, Layout* layout) {
  const int n = layout->num_pipelines();
  if (!f.micro_batches.empty()) {
    if (static_cast<int>(f.micro_batches.size()) != n)
      return refuse("--micro-batches gives " + std::to_string(f.micro_batches.size()) + " sizes, but " +
                    (layout->symmetric() ? "dp=" + std::to_string(n) + " (one per data-parallel rank)"
                                         : "the layout has " + std::to_string(n) +
                                               " pipelines (data-parallel replicas; one size each)"));
    layout->set_micro_batches(f.micro_batches);
  } else if (layout->symmetric() && layout->micro_batch.empty()) {
    if (f.micro_batch < 1 || f.micro_batch > (1 << 20))
      return Status::InvalidArgument("--micro-batch must be in [1, 1048576]");
    layout->micro_batch.assign(static_cast<size_t>(n), static_cast<int>(f.micro_batch));
  }
  return Status::Ok();
}

// The trainer splits whole KV heads over a stage's TP ranks (no KV replication).
Status check_kv_heads(const Layout& layout, const LlamaConfig& c) {
  for (int p = 0; p < layout.num_pipelines(); ++p)
    for (int s = 0; s < layout.num_stages(p); ++s) {
      const int tp = layout.stage_tp(p, s);
      if (c.num_key_value_heads % tp == 0) continue;
      const std::string where = layout.symmetric() ? "" : "pipeline " + std::to_string(p) + " stage " + std::to_string(s) + ": ";
      return refuse(where + "tp=" + std::to_string(tp) + " does not divide num_key_value_heads=" +
                    std::to_string(c.num_key_value_heads) +
                    ": the trainer splits whole KV heads over tensor-parallel ranks (no KV replication)");
    }
  return Status::Ok();
}

}  // namespace

Result<Layout> train_layout(const TrainLayoutFlags& f, const LlamaConfig& c, int world_size) {
  CKPT_ASSIGN_OR_RETURN(Layout layout, base_layout(f, c));
  CKPT_RETURN_IF_ERROR(set_batches(f, &layout));
  CKPT_RETURN_IF_ERROR(layout.validate());
  CKPT_RETURN_IF_ERROR(check_layout_views(layout, LlamaShardingRules(c)));
  CKPT_RETURN_IF_ERROR(check_kv_heads(layout, c));
  if (layout.world_size() != world_size)
    return Status::Error("WorldSizeMismatch",
                         "the layout " + layout.to_string() + " needs " +
                             (layout.symmetric() ? "tp*pp*dp = " : "the sum of its stages' tp = ") +
                             std::to_string(layout.world_size()) + " processes, but " + std::to_string(world_size) +
                             (world_size == 1 ? " was started (run it with mpirun -np " +
                                                    std::to_string(layout.world_size()) + ")"
                                              : " were started (mpirun -np)"));
  return layout;
}

}  // namespace ckpt::trainer
