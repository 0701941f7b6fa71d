#include "converters/jobs/inspect_job.h"

#include <string>
#include <vector>

#include "converters/megatron/megatron_vpp.h"
#include "converters/quant/quant_scheme.h"
#include "converters/source/open_checkpoint.h"
#include "formats/store/summary.h"
#include "reshard/layout/layout.h"

namespace ckpt {

namespace {

// InspectOutcome::layout_detail of the layout JSON `lj`, or null when it is not a valid layout.
nlohmann::json layout_detail(const nlohmann::json& lj) {
  if (!lj.is_object()) return nullptr;
  auto l = Layout::from_json(lj);
  if (!l.ok()) return nullptr;
  nlohmann::json pls = nlohmann::json::array();
  for (int p = 0; p < l->num_pipelines(); ++p) {
    nlohmann::json stages = nlohmann::json::array();
    for (int s = 0; s < l->num_stages(p); ++s) {
      std::vector<int> ranks;
      for (int t = 0; t < l->stage_tp(p, s); ++t) ranks.push_back(l->rank_of(s, p, t));
      const int first = l->stage_first_layer(p, s);
      stages.push_back({{"stage", s},
                        {"layers", {first, first + l->stage_layers(p, s) - 1}},
                        {"tp", l->stage_tp(p, s)},
                        {"ep", l->stage_ep(p, s)},
                        {"etp", l->stage_expert_tp(p, s)},
                        {"device", l->stage_device(p, s)},
                        {"ranks", ranks}});
    }
    pls.push_back({{"pipeline", p}, {"micro_batch", l->pipeline_micro_batch(p)}, {"stages", stages}});
  }
  return {{"form", l->symmetric() ? "symmetric" : "general"},
          {"world_size", l->world_size()},
          {"zero", l->zero},
          {"uniform_pipelines", l->uniform_pipelines()},
          {"pipelines", pls}};
}

// InspectOutcome::virtual_pipeline of a source's metadata, or null.
nlohmann::json virtual_pipeline(const nlohmann::json& md) {
  if (!md.is_object() || !md.contains("megatron") || !md["megatron"].is_object()) return nullptr;
  const nlohmann::json& m = md["megatron"];
  if (!m.contains("virtual_pipeline") || !m["virtual_pipeline"].is_number_integer()) return nullptr;
  const int64_t v = m["virtual_pipeline"].get<int64_t>();
  nlohmann::json out = {{"size", v}};
  const nlohmann::json& args = md.contains("megatron_args") ? md["megatron_args"] : nlohmann::json();
  auto num = [&](const char* k) {
    return args.is_object() && args.contains(k) && args[k].is_number_integer() ? args[k].get<int64_t>() : int64_t{0};
  };
  const int64_t pp = num("pipeline_model_parallel_size"), layers = num("num_layers");
  if (pp < 1 || pp > (1 << 16) || v < 1 || v > (1 << 16)) return out;
  out["pp"] = pp;
  nlohmann::json chunks = nlohmann::json::array();
  for (int p = 0; p < pp; ++p)
    for (int c = 0; c < v; ++c) {
      auto ch = megatron_vpp_chunk(layers, static_cast<int>(pp), static_cast<int>(v), p, c, "inspect");
      if (!ch.ok()) return out;
      chunks.push_back({{"pp_rank", p}, {"chunk", c}, {"layers", {ch->first_layer, ch->first_layer + ch->num_layers - 1}}});
    }
  out["chunks"] = chunks;
  return out;
}

// InspectOutcome::optimizer of a source: its optimizer.* tensor kinds and metadata, or null.
nlohmann::json optimizer_found(const TensorSource& src) {
  bool has[3] = {false, false, false};
  const char* kinds[3] = {"exp_avg", "exp_avg_sq", "fp32_param"};
  for (const auto& t : src.tensors())
    for (int k = 0; k < 3; ++k)
      if (t.name.rfind(std::string("optimizer.") + kinds[k] + ".", 0) == 0) has[k] = true;
  if (!has[0] && !has[1] && !has[2]) return nullptr;
  nlohmann::json moments = nlohmann::json::array();
  for (int k = 0; k < 2; ++k)
    if (has[k]) moments.push_back(kinds[k]);
  nlohmann::json out = {{"moments", moments}, {"fp32_masters", has[2]}, {"step", nullptr}};
  const nlohmann::json& md = src.metadata();
  if (!md.is_object()) return out;
  const nlohmann::json* mg = md.contains("megatron") && md["megatron"].is_object() ? &md["megatron"] : nullptr;
  if (mg && mg->contains("optimizer_step") && (*mg)["optimizer_step"].is_number_integer()) out["step"] = (*mg)["optimizer_step"];
  else if (md.contains("trainer") && md["trainer"].is_object() && md["trainer"].contains("step") &&
           md["trainer"]["step"].is_number_integer())
    out["step"] = md["trainer"]["step"];
  if (mg && mg->contains("optimizer_sharding_type") && (*mg)["optimizer_sharding_type"].is_string())
    out["sharding_type"] = (*mg)["optimizer_sharding_type"];
  if (md.contains("megatron_args") && md["megatron_args"].is_object() && md["megatron_args"].contains("optimizer") &&
      md["megatron_args"]["optimizer"].is_string())
    out["optimizer"] = md["megatron_args"]["optimizer"];
  return out;
}

}  // namespace

nlohmann::json InspectOutcome::to_json() const {
  nlohmann::json j = summary;
  j["layout_detail"] = layout_detail;
  j["integrity"] = {{"scheme", integrity_scheme}, {"note", integrity_note}};
  if (!not_imported.empty()) j["not_imported"] = not_imported;
  if (!virtual_pipeline.is_null()) j["virtual_pipeline"] = virtual_pipeline;
  if (!optimizer.is_null()) j["optimizer"] = optimizer;
  if (!quantization.is_null()) j["quantization"] = quantization;
  return j;
}

std::string InspectOutcome::to_text() const {
  std::string t = store::text_summary(to_json());
  if (!virtual_pipeline.is_null()) {
    t += "virtual pipeline: " + std::to_string(virtual_pipeline.value("size", int64_t{0})) + " chunks per stage (interleaved)";
    if (virtual_pipeline.contains("chunks")) {
      t += ":";
      for (const auto& c : virtual_pipeline["chunks"])
        t += " stage " + c["pp_rank"].dump() + " chunk " + c["chunk"].dump() + " = layers " + c["layers"][0].dump() +
             "-" + c["layers"][1].dump() + ";";
      t.pop_back();
    }
    t += "\n";
  }
  if (summary.contains("detected") && summary["detected"].is_string()) t += "detected:   " + summary["detected"].get<std::string>() + "\n";
  if (!optimizer.is_null()) {
    std::string m;
    for (const auto& k : optimizer["moments"]) m += (m.empty() ? "" : ", ") + k.get<std::string>();
    t += "optimizer:  " + (optimizer.contains("optimizer") ? optimizer["optimizer"].get<std::string>() + ", " : std::string()) +
         "moments " + (m.empty() ? std::string("none") : m) + (optimizer["fp32_masters"].get<bool>() ? ", fp32 masters" : "") +
         ", step " + (optimizer["step"].is_null() ? std::string("none recorded") : optimizer["step"].dump()) +
         (optimizer.contains("sharding_type") ? ", sharding " + optimizer["sharding_type"].get<std::string>() : std::string()) + "\n";
  }
  if (quantization.contains("error")) t += "quantized:  " + quantization["error"].get<std::string>() + "\n";
  else if (!quantization.is_null())
    t += "quantized:  " + quantization["scheme"].get<std::string>() + " (" + quantization["tensors"].dump() + " tensors), " +
         quantization["stored_bytes"].dump() + " bytes stored vs " + quantization["bf16_bytes"].dump() + " in bf16 (saves " +
         std::to_string(static_cast<int>(quantization["saved_fraction"].get<double>() * 100 + 0.5)) + "%)\n";
  for (auto it = not_imported.begin(); it != not_imported.end(); ++it)
    t += "not imported (" + it.key() + "): " + (it.value().is_string() ? it.value().get<std::string>() : it.value().dump()) + "\n";
  return t;
}

Result<InspectOutcome> run_inspect_job(const InspectRequest& req) {
  CKPT_ASSIGN_OR_RETURN(auto src, req.source_profile.empty() ? open_checkpoint_as_stored(req.path)
                                                             : open_checkpoint_in_profile(req.path, req.source_profile));
  const IntegrityInfo integrity = src->integrity();
  const CheckpointKind* kind = detect_checkpoint(req.path);
  const std::string format = !integrity.format.empty() ? integrity.format : kind ? kind->name : "";
  const store::SourceExtras extras = store::extras_of(*src, format);
  InspectOutcome out;
  out.summary = store::summarize_source(*src, &extras);
  out.layout_detail = layout_detail(out.summary["layout"]);
  out.integrity_scheme = integrity.scheme;
  out.integrity_note = integrity.cannot_check;
  const nlohmann::json& md = src->metadata();
  if (md.is_object() && md.contains("megatron") && md["megatron"].is_object() && md["megatron"].contains("optimizer_not_imported"))
    out.not_imported["optimizer"] = md["megatron"]["optimizer_not_imported"];
  out.virtual_pipeline = virtual_pipeline(md);
  if (md.is_object() && md.contains("deepspeed") && md["deepspeed"].is_object()) {  // converters/deepspeed
    const nlohmann::json& ds = md["deepspeed"];
    if (ds.contains("optimizer_not_imported")) out.not_imported["optimizer"] = ds["optimizer_not_imported"];
    if (ds.contains("detected")) out.summary["detected"] = ds["detected"];
  }
  if (md.is_object() && md.contains("source_detected") && md["source_detected"].is_object()) {  // converters/paddle, --source-profile
    const nlohmann::json& d = md["source_detected"];
    out.summary["detected"] = d.value("kind", "") + " " + d.value("files", "") + ", read in profile " + d.value("profile", "") + ", " +
                              d.value("dtype", "") + " (" + d.value("why", "") + ")";
  }
  out.optimizer = optimizer_found(*src);
  auto quant = find_quantized(src->tensors(), md);
  if (!quant.ok()) out.quantization = {{"error", quant.status().to_string()}};
  else if (quant->any()) out.quantization = quant->summary();
  return out;
}

}  // namespace ckpt
