#include "trainer/memory_report.h"

#include <sys/stat.h>

#include <cstdio>

#include "formats/base/byte_size.h"
#include "formats/base/fs_util.h"

namespace ckpt::trainer {

MemoryInputs memory_inputs(const LlamaConfig& config, const Layout& layout, int64_t seq_len, int64_t grad_accum,
                           bool checkpoints, const std::string& data_path) {
  MemoryInputs in;
  in.config = config;
  in.layout = layout;
  in.seq_len = seq_len;
  in.grad_accum = grad_accum;
  in.checkpoints = checkpoints;
  in.mpi = Comm::launched_under_mpi();
  struct stat st;
  if (!data_path.empty() && ::stat(data_path.c_str(), &st) == 0 && st.st_size > 0)
    in.data_bytes = static_cast<uint64_t>(st.st_size);
  return in;
}

Status check_cluster_memory(const std::string& cluster_file, const MemoryInputs& in, std::string* summary) {
  if (cluster_file.empty()) return Status::Ok();
  CKPT_ASSIGN_OR_RETURN(Cluster cluster, Cluster::from_file(cluster_file));
  {
    Status st = check_cluster_layout(cluster, in.layout);
    if (!st.ok()) return std::move(st).with_file(cluster_file);
  }
  CKPT_ASSIGN_OR_RETURN(std::vector<RankMemory> est, estimate_memory(in));
  {
    Status st = check_memory(est, cluster);
    if (!st.ok()) return std::move(st).with_file(cluster_file);
  }
  if (summary && !est.empty()) {
    const RankMemory* tight = &est[0];
    double worst = 0;
    for (const RankMemory& m : est) {
      const double f = static_cast<double>(m.total()) / static_cast<double>(cluster.device_of(m.rank).memory_bytes);
      if (f > worst) worst = f, tight = &m;
    }
    const DeviceType& d = cluster.device_of(tight->rank);
    char buf[96];
    std::snprintf(buf, sizeof buf, " (%.0f%%)", 100 * worst);
    *summary = "memory check: every rank fits; the tightest is rank " + std::to_string(tight->rank) + " on '" +
               d.name + "': " + human_bytes(tight->total()) + " of " + human_bytes(d.memory_bytes) + buf;
  }
  return Status::Ok();
}

namespace {

void print_table(const std::vector<RankMemory>& est, const std::vector<uint64_t>& rss) {
  std::printf("memory per rank (estimate before training, peak RSS measured):\n");
  std::printf("%5s %14s %-12s %12s %12s %6s\n", "rank", "pipe/stage/tp", "device", "estimate", "peak RSS", "ratio");
  for (size_t r = 0; r < est.size() && r < rss.size(); ++r) {
    const RankMemory& m = est[r];
    const std::string where = std::to_string(m.place.pipeline) + "/" + std::to_string(m.place.stage) + "/" +
                              std::to_string(m.place.tp_rank);
    std::printf("%5d %14s %-12s %12s %12s %6.2f\n", m.rank, where.c_str(), m.device.empty() ? "-" : m.device.c_str(),
                human_bytes(m.total()).c_str(), human_bytes(rss[r]).c_str(),
                rss[r] ? static_cast<double>(m.total()) / static_cast<double>(rss[r]) : 0.0);
  }
  std::fflush(stdout);
}

}  // namespace

Status report_memory(Comm& world, const MemoryInputs& in, const std::string& run_dir, bool print) {
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> all, world.gather(std::to_string(peak_rss_bytes())));
  if (world.rank() != 0 || (run_dir.empty() && !print)) return Status::Ok();
  // The run is done: an estimate that cannot be made (a layout the estimate does not know) is
  // reported in the file, not as the run's error.
  auto est = estimate_memory(in);
  std::vector<uint64_t> rss;
  for (const std::string& s : all) rss.push_back(std::strtoull(s.c_str(), nullptr, 10));
  nlohmann::json ranks = nlohmann::json::array();
  for (size_t r = 0; r < rss.size(); ++r) {
    nlohmann::json j = {{"rank", r}};
    if (est.ok() && r < est->size()) {
      j = (*est)[r].to_json();
      j["ratio"] = rss[r] ? static_cast<double>((*est)[r].total()) / static_cast<double>(rss[r]) : 0.0;
    }
    j["peak_rss"] = rss[r];
    ranks.push_back(std::move(j));
  }
  if (!run_dir.empty()) {
    nlohmann::json doc = {{"layout", in.layout.to_json()},
                          {"seq_len", in.seq_len},
                          {"grad_accum", in.grad_accum},
                          {"process_bytes", process_bytes(in.mpi, in.layout.world_size())},
                          {"ranks", ranks}};
    if (!est.ok()) doc["estimate_error"] = est.status().to_string();
    CKPT_RETURN_IF_ERROR(write_file_atomic(run_dir + "/memory.json", doc.dump(1) + "\n"));
  }
  if (print && est.ok()) print_table(*est, rss);
  return Status::Ok();
}

}  // namespace ckpt::trainer
