// The memory every rank of the parallel trainer needs, estimated before training from the model
// config, the layout and the batch shape, and checked against the device memory of the cluster
// file (reshard/dist/cluster.h); at the end of a run, the measured peak RSS of every rank next to it.
// The estimate follows what the trainer allocates (all fp32, 4 bytes an element):
// - weights and gradients: the rank's boxes of its stage's parameters (planner rank_view under the
//   stage's Layout::stage_view: exact element counts, vocabulary padding and TP boxes included);
// - optimizer: the two Adam moments of what the rank updates (its boxes, or its ZeRO-1 flat range;
//   with expert parallelism (ep > 1 or etp != tp; docs/MOE.md; per stage in a layout of pipelines:
//   the stage view's ep, etp and dp) its boxes hold E/ep experts sliced
//   F/etp, and under ZeRO-1 it holds two whole shards, padding included: of the dense buffer over
//   dp and of the expert buffer over edp = tp dp / (ep etp), zero_layout.h);
// - activations: per 1F1B slot (pipe_slots(stage, stages, grad_accum)) of n = micro_batch*seq rows,
//   per layer what DecoderLayer keeps (xn1, x_mid, xn2 [n,D]; q, att [n,H/tp*hd]; k, v [n,K/tp*hd];
//   probs [mb,H/tp,seq,seq]; gate, up, silu*up [n,F/tp], or an MoE layer's MoeActs with the rank's
//   R = n k etp / tp routed rows under balanced routing; two rstd [n]) plus the stage's residual
//   stream at every layer boundary, tokens (first stage), final norm and logits [n,V/tp] (last);
// - workspace: the shared backward scratch (Workspace), the RoPE tables and the four [n,D]
//   stage-boundary buffers of the pipeline step;
// - buffers: the DP gradient buffer (zero 0 with replicas: every gradient packed, the upper bound
//   of ReplicaSum's largest holder set; zero 1: the padded flat buffer plus the master and
//   gradient shards, and so for the expert buffer under expert parallelism), the corpus file when one is given;
// - checkpoint: the saver's staging copy of the pieces this rank writes (with a run dir) and its
//   background write's pool (save_write_pool_buffers, trainer/state/dist_checkpoint.h);
// - process: a measured constant (binary, libc, OpenMPI and OpenBLAS; process_bytes).
// Pure functions except peak_rss_bytes (getrusage); thread safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/model/llama_config.h"
#include "formats/base/status.h"
#include "reshard/dist/cluster.h"
#include "reshard/layout/layout.h"

namespace ckpt::trainer {

// Peak RSS of a `ckpt train` process whose model is negligible (fixtures/tiny_llama.json, one
// step), measured on the development machine (docs/BENCHMARKS.md "Memory estimate"):
// the binary and its libraries, OpenBLAS's buffers; under mpirun also OpenMPI's libraries and its
// shared-memory segments, which grow with the number of peers (measured: 29.8 MiB at -np 2,
// 31.8 MiB at -np 4; one process alone 23.8 MiB).
inline constexpr uint64_t kProcessBytes = uint64_t{24} << 20;
inline constexpr uint64_t kMpiProcessBytes = uint64_t{28} << 20;
inline constexpr uint64_t kMpiPeerBytes = uint64_t{1} << 20;  // per rank of the world, up to 64

struct MemoryInputs {
  LlamaConfig config;
  Layout layout;              // validated, with every pipeline's micro-batch size
  int64_t seq_len = 1;
  int64_t grad_accum = 1;     // micro-batches per pipeline per step (1F1B slots)
  bool checkpoints = false;   // a run dir: the saver's staging buffers count
  uint64_t data_bytes = 0;    // corpus file held in memory (0: procedural)
  bool mpi = false;           // launched under mpirun (the process constant is larger)
};

// The process constant of one rank (see kProcessBytes).
uint64_t process_bytes(bool mpi, int world_size);

struct RankMemory {
  int rank = 0;
  RankPlace place;
  std::string device;         // the layout's device type of the stage ("" when not named)
  uint64_t weights = 0, grads = 0, optimizer = 0, activations = 0, workspace = 0, buffers = 0,
           checkpoint = 0, process = 0;
  uint64_t total() const {
    return weights + grads + optimizer + activations + workspace + buffers + checkpoint + process;
  }
  // "weights 1.00 MiB, gradients ..., process 24.00 MiB"
  std::string breakdown() const;
  nlohmann::json to_json() const;
};

// Every rank's estimate, in rank order. Errors: the layout's or the rules' (a tp not dividing the
// heads...), as the trainer would report them.
Result<std::vector<RankMemory>> estimate_memory(const MemoryInputs& in);

// One stage of a layout the planner weighs (trainer/plan: `ckpt plan --memory-model embedded`):
// `layers` layers at tensor-parallel size tp, holding the embedding (first) and / or the head
// (last), micro-batches of `micro_batch` sequences, `slots` of them in flight (pipe_slots),
// `pipelines` replicas, ZeRO-1 over zero_ways of them (1: none), in a world of world_size ranks.
struct StageMemoryQuery {
  int layers = 1, tp = 1;
  bool first = true, last = true;
  int64_t micro_batch = 1, seq_len = 1, slots = 1;
  int zero_ways = 1, pipelines = 1, world_size = 1;
  bool checkpoints = true, mpi = false;
  int ep = 1, etp = 0;  // expert parallelism of the stage (etp 0: = tp)
};

// The largest estimate among the stage's TP ranks, by the same code as estimate_memory (held
// parameters, activations, workspace, buffers, process constant). Checkpoint staging: under ZeRO-1
// as in the layout of `pipelines` identical pipelines; without, as if this rank wrote everything it
// holds (replicas share the writing in a real layout: an upper bound). With expert parallelism
// (ep > 1 or etp != tp) the pipeline is a symmetric layout (every stage at tp, Layout's ep is
// symmetric only) of zero_ways replicas under ZeRO-1, else of the fewest that ep x etp divides.
// Errors: a stage that does
// not fit the model's layers, the layout's rules (tp not dividing the heads...).
Result<RankMemory> estimate_stage_memory(const LlamaConfig& config, const StageMemoryQuery& q);

// The first rank whose estimate exceeds its device type's memory: RankOutOfMemory naming the rank,
// its (pipeline, stage, tp rank), the device type, the estimate with its breakdown and the
// capacity. `est` comes from estimate_memory for a layout that check_cluster_layout accepted.
Status check_memory(const std::vector<RankMemory>& est, const Cluster& cluster);

// This process's peak resident set so far, bytes (getrusage ru_maxrss).
uint64_t peak_rss_bytes();

}  // namespace ckpt::trainer
