#include "converters/jobs/verify_job.h"

#include <chrono>

#include "converters/source/open_checkpoint.h"

namespace ckpt {

nlohmann::json VerifyOutcome::to_json() const {
  nlohmann::json fails = nlohmann::json::array();
  for (const auto& f : failures) {
    nlohmann::json fj = {{"code", f.status.code()}, {"tensor", f.tensor}, {"file", f.file}, {"message", f.status.to_string()}};
    fj["piece"] = f.piece == CheckFailure::kNoPiece ? nlohmann::json(nullptr) : nlohmann::json(f.piece);
    if (!f.dataset.empty()) fj["dataset"] = f.dataset;
    fails.push_back(std::move(fj));
  }
  nlohmann::json j = {{"path", path},   {"format", format}, {"ok", ok()},         {"structure_ok", true},
                      {"checksums", checksums}, {"scheme", scheme}, {"pieces", pieces}, {"bytes", bytes},
                      {"seconds", seconds},     {"failures", fails}};
  if (checksums) j["digests"] = digests;
  if (!cannot_check.empty()) j["note"] = cannot_check;
  return j;
}

Result<VerifyOutcome> verify_checkpoint(const std::string& path, int threads,
                                        const std::function<void(uint64_t, uint64_t)>& progress,
                                        const std::string& source_profile) {
  if (threads < 1 || threads > 64)
    return Status::InvalidArgument("threads " + std::to_string(threads) + ": expected 1..64");
  CKPT_ASSIGN_OR_RETURN(auto src, source_profile.empty() ? open_checkpoint(path) : open_checkpoint_in_profile(path, source_profile));
  const IntegrityInfo info = src->integrity();
  CheckOptions o;
  o.threads = threads;
  o.progress = progress;
  const auto t0 = std::chrono::steady_clock::now();
  CheckReport rep = src->check(o);
  VerifyOutcome out;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.checksums = info.checks();
  out.scheme = info.scheme;
  out.cannot_check = info.cannot_check;
  out.digests.insert(info.digests.begin(), info.digests.end());
  const CheckpointKind* ck = detect_checkpoint(path);
  out.format = !info.format.empty() ? info.format : ck ? ck->name : "unknown";
  out.path = src->describe();
  out.pieces = rep.pieces;
  out.bytes = rep.bytes;
  for (auto& f : rep.failures) {
    std::string tensor = !f.tensor.empty() ? f.tensor : f.status.tensor();
    std::string file = !f.file.empty() ? f.file : f.status.file();
    out.failures.push_back({std::move(f.status), f.piece, std::move(tensor), std::move(file), std::move(f.unit)});
  }
  return out;
}

}  // namespace ckpt
