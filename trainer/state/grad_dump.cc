#include "trainer/state/grad_dump.h"

#include <cstring>

#include "formats/store/store_writer.h"
#include "reshard/executor.h"
#include "reshard/memory_io.h"

namespace ckpt::trainer {

namespace {

// One rank's regions: 8 bytes of header length, the JSON header [{tensor, offset, extent,
// flat_begin, flat_end}], then the values of every region in order.
std::string pack(const std::vector<GradRegion<float>>& regions) {
  nlohmann::json h = nlohmann::json::array();
  size_t bytes = 0;
  for (const auto& r : regions) {
    h.push_back({{"tensor", r.tensor}, {"offset", r.region.box.offset}, {"extent", r.region.box.extent},
                 {"flat_begin", r.region.flat_begin}, {"flat_end", r.region.flat_end}});
    bytes += sizeof(float) * static_cast<size_t>(r.region.numel());
  }
  const std::string head = h.dump();
  std::string out(8 + head.size() + bytes, '\0');
  const uint64_t n = head.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, head.data(), head.size());
  size_t at = 8 + head.size();
  for (const auto& r : regions) {
    const size_t b = sizeof(float) * static_cast<size_t>(r.region.numel());
    if (b) std::memcpy(out.data() + at, r.data, b);
    at += b;
  }
  return out;
}

Status unpack(const std::string& blob, MemoryCheckpoint* into) {
  uint64_t n = 0;
  if (blob.size() < 8) return Status::Internal("gradient dump: short message");
  std::memcpy(&n, blob.data(), 8);
  if (n > blob.size() - 8) return Status::Internal("gradient dump: bad header length");
  const auto h = nlohmann::json::parse(blob.substr(8, n));
  size_t at = 8 + n;
  for (const auto& e : h) {
    Region r;
    r.box.offset = e.at("offset").get<Shape>();
    r.box.extent = e.at("extent").get<Shape>();
    r.flat_begin = e.at("flat_begin").get<int64_t>();
    r.flat_end = e.at("flat_end").get<int64_t>();
    const size_t b = sizeof(float) * static_cast<size_t>(r.numel());
    if (b > blob.size() - at) return Status::Internal("gradient dump: short values");
    into->pieces.push_back({e.at("tensor").get<std::string>(), r, DType::kF32});
    into->data.emplace_back(blob.begin() + static_cast<std::ptrdiff_t>(at),
                            blob.begin() + static_cast<std::ptrdiff_t>(at + b));
    at += b;
  }
  return Status::Ok();
}

}  // namespace

Status dump_gradients(Comm& world, const LlamaConfig& cfg, const std::vector<GradRegion<float>>& mine,
                      const std::string& dir) {
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> all, world.gather(pack(mine)));
  Status st;
  if (world.rank() == 0) {
    MemoryCheckpoint mc;
    mc.tensors = llama_model_tensors(cfg, DType::kF32);
    for (const std::string& blob : all)
      if (st.ok()) st = unpack(blob, &mc);
    std::vector<Piece> whole;
    for (const TensorMeta& t : mc.tensors) whole.push_back({t.name, Region{Box::whole(t.shape)}, DType::kF32});
    const nlohmann::json md = {{"model_config", cfg.to_json()}, {"gradients", true}};
    if (st.ok()) {
      MemorySource src(std::move(mc), "gradients");
      store::StoreWriter w(dir);
      st = execute(src, w, src.tensors(), whole, md);
    }
    if (!st.ok()) st = std::move(st).with_context("--dump-grads " + dir);
  }
  return world.agree(st);
}

}  // namespace ckpt::trainer
