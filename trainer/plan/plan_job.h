// One `ckpt plan` search or evaluation below the CLI (cli/cmd_plan.cc, python ckpt.plan): the
// cluster, model config and calibration files read, the search (search.h) with the hand-written
// baseline it is compared with, or one layout file's predicted cost (cost_model.h); and the JSON
// of `ckpt plan --json`. Thread safety: reentrant.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/model/llama_config.h"
#include "formats/base/status.h"
#include "reshard/layout/layout.h"
#include "trainer/plan/cost_model.h"
#include "trainer/plan/search.h"

namespace ckpt::trainer {

struct PlanRequest {
  std::string cluster;      // cluster JSON file (docs/CLUSTER.md)
  std::string model;        // HF LlamaForCausalLM config.json (unless a config is given)
  std::string evaluate;     // a layout file to evaluate instead of searching
  std::string calibration;  // `ckpt plan --calibrate -o FILE` output; empty: none
  int64_t global_batch = 0;
  int64_t seq_len = 0;      // 0: the model's max_position_embeddings
  int top = 3;
  bool trainer_memory = false;  // evaluate: also each rank's memory as `ckpt train` allocates it
  std::string memory_model = "megatron";  // memory_model.h: "megatron" | "embedded" (`ckpt train`)
  double router_load = 1;   // MoE: ModelSpec::router_load (max / mean tokens per expert assumed), in [1, experts]
};

// The models `ckpt plan` prices: dense LLaMA, Mixtral, Qwen2-MoE, Qwen3-MoE. DeepSeek-V3 (MLA
// attention, which the trainer does not have) and gpt-oss are refused: UnsupportedModel naming the
// family and `what`.
Status check_plan_model(const LlamaConfig& cfg, const std::string& what);

// The measured cost terms of a calibration file (none for an empty name).
Result<CostCalibration> load_cost_calibration(const std::string& file);

struct PlanEvaluation {
  Layout layout;
  PlanCost cost;
  std::vector<uint64_t> trainer_memory;  // per rank, when asked for
  // cost.to_json() with "layout" (and ranks[].trainer_memory_bytes).
  nlohmann::json to_json() const;
};

// Needs cluster, model, evaluate and global_batch >= 1.
Result<PlanEvaluation> evaluate_plan(const PlanRequest& req);

struct PlanSearchOutcome {
  SearchResult result;                 // result.best[0] is the best layout
  std::optional<PlanCandidate> hand;   // the hand-written layout (tp = devices per node), if it exists
  double predicted_gain = 0;           // hand step time / best step time (0: no feasible hand layout)
  // {best, next (with why_slower), seconds, arrangements, evaluated, exhaustive, cross_node_tp,
  //  memory_model, hand_written?, predicted_gain?}; each candidate: cost.to_json() with layout (in
  //  full: what `ckpt train --layout` reads), layout_text (layout_text: "64 x ..."), placement.
  nlohmann::json to_json() const;
};

// Needs cluster and global_batch >= 1, and model unless `config` is given.
Result<PlanSearchOutcome> search_plan(const PlanRequest& req, const LlamaConfig* config = nullptr);

}  // namespace ckpt::trainer
