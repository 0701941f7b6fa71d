// Layout: how a model is split over ranks (tensor, pipeline and data parallel; ZeRO stage;
// pipeline stage of every layer, uneven splits allowed; per-DP-rank micro-batch sizes).
// Rank order follows Megatron-LM: rank = (pp_rank * dp + dp_rank) * tp + tp_rank.
// Plain value type; thread safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/status.h"

namespace ckpt {

struct Layout {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  int zero = 0;                          // 0: optimizer state replicated over DP; 1: ZeRO-1 flat shards
  std::vector<int> stage_of_layer;       // size = num_layers; non-decreasing, every stage non-empty
  std::vector<int> micro_batch;          // size = dp (heterogeneous DP); empty = all 1
  int64_t vocab_divisor = 128;           // Megatron make-vocab-size-divisible-by (padding = divisor*tp)
  std::string profile = "reference";     // vendor profile name

  int world_size() const { return tp * pp * dp; }
  int rank_of(int pp_rank, int dp_rank, int tp_rank) const { return (pp_rank * dp + dp_rank) * tp + tp_rank; }
  int num_layers() const { return static_cast<int>(stage_of_layer.size()); }
  // First layer and number of layers of stage s.
  int first_layer(int stage) const;
  int layers_in_stage(int stage) const;
  // Padded vocabulary for this layout: ceil(V / (vocab_divisor * tp)) * vocab_divisor * tp.
  int64_t padded_vocab(int64_t vocab_size) const;

  // Even split of `num_layers` over `pp` stages (earlier stages take the remainder), or the
  // given per-stage layer counts.
  static Result<Layout> make(int tp, int pp, int dp, int zero, int num_layers,
                             const std::vector<int>& layers_per_stage = {});
  // Structural checks that need no model knowledge (sizes positive, every stage non-empty and
  // contiguous, micro_batch size, zero in {0,1}). Model checks live in ShardingRules.
  Status validate() const;
  nlohmann::json to_json() const;  // {"tp":..,"pp":..,"dp":..,"zero":..,"layers_per_stage":[..],...}
  static Result<Layout> from_json(const nlohmann::json& j);
  // A layout file (`ckpt reshard --layout FILE`): read_json_file with kLayoutJsonLimits (JSON
  // rules: kCorruption), then from_json (BadLayout); errors carry the file.
  static Result<Layout> from_file(const std::string& path);
  // For a layout made from flags: takes vocab_divisor and profile from the source checkpoint's
  // layout JSON `src` where it names valid ones (flags do not set them).
  void keep_source_settings(const nlohmann::json& src);
  std::string to_string() const;   // "tp=2 pp=3 [2,3,3] dp=1 zero=1"
};

}  // namespace ckpt
