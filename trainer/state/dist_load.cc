// dist_load (trainer/state/dist_checkpoint.h): distributed source check, then each rank reads its own
// held regions through the engine.
#include <algorithm>

#include "converters/profile/profile_view.h"
#include "converters/profile/profile_view_job.h"
#include "formats/store/store_reader.h"
#include "reshard/executor.h"
#include "reshard/source_index.h"
#include "trainer/state/dist_checkpoint.h"

#include "reshard/layout/balance.h"

namespace ckpt::trainer {

namespace {

// This rank's share of the digest check: the pieces balanced over the ranks by bytes
// (reshard/layout/balance.h; deterministic over the manifest, so the shares tile it).
std::vector<size_t> my_verify_share(const store::Manifest& m, int rank, int nranks) {
  std::vector<uint64_t> sizes;
  for (const auto& p : m.pieces) sizes.push_back(p.bytes);
  return balanced_share(sizes, nranks, rank);
}

// `reader`: the store, or its canonical view when it is stored in another profile. weights_only:
// no 'trainer' metadata needed, only the model tensors.
Status check_config(const TensorSource& reader, const LlamaConfig& cfg, bool weights_only) {
  const auto& md = reader.metadata();
  const std::string where = reader.describe();
  if (!md.is_object() || !md.contains("model_config") || (!weights_only && !md.contains("trainer")))
    return Status::Error("NotTrainerCheckpoint", "checkpoint '" + where + "' has no 'trainer' or 'model_config' metadata")
        .with_file(where);
  CKPT_ASSIGN_OR_RETURN(LlamaConfig stored, LlamaConfig::from_json(md.at("model_config")));
  if (stored.to_json() != cfg.to_json())
    return Status::InvalidArgument("checkpoint '" + where + "' model_config " + stored.to_json().dump() +
                                   " differs from the training config " + cfg.to_json().dump());
  const std::vector<TensorMeta> want = weights_only ? llama_model_tensors(cfg, DType::kF32) : trainer_tensors(cfg);
  for (const TensorMeta& t : want) {
    auto it = std::find_if(reader.tensors().begin(), reader.tensors().end(),
                           [&](const TensorMeta& x) { return x.name == t.name; });
    if (it == reader.tensors().end())
      return Status::NotFound("checkpoint '" + where + "' has no tensor '" + t.name + "'").with_tensor(t.name);
    if (it->shape != t.shape)
      return Status::Error("ShapeMismatch", "tensor '" + t.name + "': expected shape " + shape_to_string(t.shape) +
                                                ", got " + shape_to_string(it->shape))
          .with_tensor(t.name);
  }
  return Status::Ok();
}

// This rank's share of the digests; the first failure names the piece.
Status verify_share(store::StoreReader& reader, int rank, int nranks) {
  store::VerifyReport rep = reader.verify_pieces(my_verify_share(reader.manifest(), rank, nranks));
  if (rep.ok()) return Status::Ok();
  const size_t i = rep.failures.front().piece;
  const store::PieceRecord& rec = reader.manifest().pieces[i];
  return std::move(rep.failures.front().status)
      .with_context("resume source " + reader.describe() + ": piece #" + std::to_string(i) + " of tensor '" +
                    rec.piece.tensor + "' region " + rec.piece.region.to_string() + " in '" + rec.file +
                    "' is missing or corrupt; nothing was loaded");
}

// Reads every held region (a flat range as its boxes, in storage order) from `reader`.
Status read_held(TensorSource& reader, const std::vector<HeldRegion>& held) {
  CKPT_ASSIGN_OR_RETURN(SourceIndex index, SourceIndex::build(reader));
  for (const HeldRegion& h : held) {
    int64_t off = 0;
    for (const Box& b : h.region.boxes()) {
      Status st = read_global_box(reader, index, h.tensor, b, DType::kF32, h.data + off);
      if (!st.ok())
        return std::move(st).with_context("loading '" + h.tensor + "' " + h.region.to_string() + " from " +
                                          reader.describe());
      off += b.numel();
    }
  }
  return Status::Ok();
}

// The canonical view of a store kept in a profile other than "reference".
Status open_resume_view(store::StoreReader& reader, std::unique_ptr<CanonicalView>& canon) {
  auto p = profile_of_metadata(reader.metadata(), reader.describe());
  if (!p.ok()) return p.take_status();
  auto v = canonical_view(reader, nullptr, *p);
  if (!v.ok()) return v.take_status().with_context("resume source " + reader.describe());
  canon = std::move(v).value();
  return Status::Ok();
}

}  // namespace

Result<nlohmann::json> dist_load(Comm& world, const std::string& path, const LlamaConfig& cfg, const Layout& layout,
                                 const std::vector<HeldRegion>& held, bool weights_only) {
  Status st;
  if (world.size() != layout.world_size())
    st = Status::Error("WorldSizeMismatch", "the world has " + std::to_string(world.size()) + " ranks, the layout " +
                                                std::to_string(layout.world_size()));
  std::unique_ptr<store::StoreReader> reader;
  if (st.ok()) {
    auto r = store::StoreReader::open(path);
    if (r.ok()) reader = std::move(r).value();
    else st = r.take_status();
  }
  // A store in another profile is read through its canonical view: the profile change happens in
  // the reads of the held regions, with the layout change (trainer/train_profile.h).
  std::unique_ptr<CanonicalView> canon;
  if (st.ok() && needs_profile_views(reader->metadata(), ProfileRequest{})) {
    st = open_resume_view(*reader, canon);
  }
  TensorSource* src = canon ? static_cast<TensorSource*>(canon.get()) : reader.get();
  if (st.ok()) st = check_config(*src, cfg, weights_only);
  CKPT_RETURN_IF_ERROR(world.agree(st));
  CKPT_RETURN_IF_ERROR(world.agree(verify_share(*reader, world.rank(), world.size())));
  CKPT_RETURN_IF_ERROR(world.agree(read_held(*src, held)));
  return src->metadata();
}

}  // namespace ckpt::trainer
