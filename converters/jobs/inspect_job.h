// One `ckpt inspect` run below the CLI (cli/cmd_inspect.cc, python ckpt.inspect): the checkpoint
// opened as stored (open_checkpoint_as_stored: a native store in a profile shows its profile's
// tensors, not its canonical view), summarized by formats/store/summary.h (layout, tensors,
// pieces, bytes, stored bytes and codecs where the source knows them, totals), its layout described
// stage by stage, and what its format can check.
// Thread safety: one call per thread.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "formats/base/status.h"

namespace ckpt {

struct InspectRequest {
  std::string path;  // any kind open_checkpoint reads; a run directory follows `latest`
  std::string source_profile = {};  // --source-profile: PATH read in this profile (its canonical view)
};

struct InspectOutcome {
  // store::summarize_source's object: path, format (the source's format name, else its kind's),
  // layout, profile, step, tensors, totals, codecs?
  nlohmann::json summary;
  // The layout as "form" (symmetric | general), world_size, zero, uniform_pipelines and
  // "pipelines": [{pipeline, micro_batch, stages: [{stage, layers: [first, last], tp, device,
  // ranks}]}]; null when the checkpoint records no valid layout.
  nlohmann::json layout_detail;
  std::string integrity_scheme;  // what `ckpt verify` checks ("xxh3-128 piece digests", "zip CRC-32", "")
  std::string integrity_note;    // what the format cannot check, by name ("" when nothing)
  // What the checkpoint holds that the source does not import, by kind, each a note naming the
  // entries and why ({"optimizer": "..."} from metadata megatron.optimizer_not_imported); empty
  // when everything is imported.
  nlohmann::json not_imported = nlohmann::json::object();
  // A Megatron virtual (interleaved) pipeline found in the checkpoint (metadata
  // megatron.virtual_pipeline): {"size": v, "pp": pp, "chunks": [{"pp_rank", "chunk", "layers":
  // [first, last]}]} (Megatron's interleaved assignment, converters/megatron/megatron_vpp.h; chunks
  // omitted when the layers do not divide); null without one.
  nlohmann::json virtual_pipeline;
  // The optimizer state found, null without any: {"moments": the kinds present of exp_avg,
  // exp_avg_sq (Adam keeps both, Lion exp_avg only), "fp32_masters": optimizer.fp32_param.* present,
  // "step" (metadata megatron.optimizer_step or trainer.step; null when none is recorded: Lion keeps
  // none), and for Megatron sources "optimizer" (args.optimizer: adam, lion, ...) and
  // "sharding_type" (the distributed optimizer's, when recorded)}.
  nlohmann::json optimizer;
  // Quantized weights (converters/quant/quant_scheme.h QuantScheme::summary, or {"error": ...} for
  // a quantized checkpoint whose scales do not fit); null when there are none.
  nlohmann::json quantization;
  // The JSON of `ckpt inspect --json`: the summary's fields, layout_detail,
  // "integrity": {scheme, note}, "virtual_pipeline" when there is one, "optimizer" when there is
  // optimizer state, "quantization" when quantized and, when anything is not imported, "not_imported".
  nlohmann::json to_json() const;
  // The text `ckpt inspect` prints (store::text_summary of to_json()).
  std::string to_text() const;
};

Result<InspectOutcome> run_inspect_job(const InspectRequest& req);

}  // namespace ckpt
