#include "formats/store/summary.h"

#include <cstdio>
#include <memory>
#include <map>
#include <set>
#include <unordered_map>

#include "formats/base/byte_size.h"
#include "formats/dtype/dtype.h"

namespace ckpt::store {

using nlohmann::json;

json summarize_source(const TensorSource& src, const SourceExtras* ex) {
  json out;
  out["path"] = src.describe();
  out["format"] = ex ? ex->format : "";
  const json& md = src.metadata();
  out["layout"] = md.contains("layout") ? md["layout"] : json(nullptr);
  out["profile"] = md.contains("profile") ? md["profile"] : json(nullptr);
  if (md.contains("exactness")) out["exactness"] = md["exactness"];  // a profile conversion's report
  out["model_config"] = md.contains("model_config") ? md["model_config"] : json(nullptr);
  out["step"] = (md.contains("trainer") && md["trainer"].is_object() && md["trainer"].contains("step")) ? md["trainer"]["step"] : json(nullptr);
  out["metadata_keys"] = json::array();
  if (md.is_object())
    for (auto it = md.begin(); it != md.end(); ++it) out["metadata_keys"].push_back(it.key());
  struct Acc {
    uint64_t pieces = 0, bytes = 0, stored = 0;
  };
  std::unordered_map<std::string, Acc> acc;
  std::map<std::string, uint64_t> codecs;
  std::set<std::string> files;
  const auto& pieces = src.pieces();
  const bool have_stored = ex && ex->stored_bytes;
  for (size_t i = 0; i < pieces.size(); ++i) {
    auto& a = acc[pieces[i].tensor];
    a.pieces++;
    a.bytes += static_cast<uint64_t>(pieces[i].region.numel()) * dtype_size(pieces[i].dtype);
    if (have_stored) a.stored += ex->stored_bytes(i);
    if (ex && ex->codec) codecs[ex->codec(i)]++;
    if (ex && ex->file) files.insert(ex->file(i));
  }
  json ts = json::array();
  uint64_t tb = 0, ts_b = 0;
  for (const auto& t : src.tensors()) {
    const Acc& a = acc[t.name];
    json j = {{"name", t.name}, {"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}, {"pieces", a.pieces}, {"bytes", a.bytes}};
    if (have_stored) j["stored_bytes"] = a.stored;
    tb += a.bytes;
    ts_b += a.stored;
    ts.push_back(std::move(j));
  }
  out["tensors"] = std::move(ts);
  json tot = {{"tensors", src.tensors().size()}, {"pieces", pieces.size()}, {"bytes", tb}};
  if (ex && ex->file) tot["files"] = files.size();
  if (have_stored) {
    tot["stored_bytes"] = ts_b;
    tot["compression_ratio"] = ts_b ? static_cast<double>(tb) / static_cast<double>(ts_b) : 1.0;
  }
  out["totals"] = tot;
  if (!codecs.empty()) out["codecs"] = codecs;
  return out;
}

namespace {

// "layout:     general, 2 pipelines, zero=1, 6 ranks" and a line per pipeline and stage.
std::string layout_detail_text(const json& det) {
  std::string o = "layout:     general, " + std::to_string(det["pipelines"].size()) + " pipelines, zero=" +
                  det["zero"].dump() + ", " + det["world_size"].dump() + " ranks\n";
  for (const auto& p : det["pipelines"]) {
    o += "  pipeline " + p["pipeline"].dump() + " (micro-batch " + p["micro_batch"].dump() + ")\n";
    for (const auto& st : p["stages"]) {
      std::string ranks;
      for (const auto& r : st["ranks"]) ranks += (ranks.empty() ? "" : ",") + r.dump();
      const std::string dev = st["device"].is_string() ? st["device"].get<std::string>() : "";
      std::string experts;  // expert parallelism of the stage (docs/MOE.md "General layouts")
      if (st.value("ep", json(1)) != json(1) || st.value("etp", st["tp"]) != st["tp"])
        experts = ", ep " + st.value("ep", json(1)).dump() + " etp " + st.value("etp", st["tp"]).dump();
      o += "    stage " + st["stage"].dump() + ": layers " + st["layers"][0].dump() + "-" + st["layers"][1].dump() +
           ", tp " + st["tp"].dump() + experts + (dev.empty() ? "" : ", device " + dev) + ", ranks " + ranks + "\n";
    }
  }
  return o;
}

}  // namespace

namespace {

// "experts:    6 stacked tensors, 1.50 MiB; ep=2: 768.00 KiB per expert rank" for a checkpoint with
// stacked MoE experts (docs/MOE.md), else "".
std::string experts_text(const json& s) {
  uint64_t bytes = 0, n = 0;
  if (s.contains("tensors") && s["tensors"].is_array())
    for (const json& t : s["tensors"])
      if (t.is_object() && t.value("name", std::string()).find(".mlp.experts.") != std::string::npos &&
          !t.value("name", std::string()).starts_with("optimizer.")) {
        bytes += t.value("bytes", uint64_t{0});
        ++n;
      }
  if (n == 0) return "";
  const int64_t ep = s["layout"].is_object() ? s["layout"].value("ep", int64_t{1}) : 1;
  std::string o = "experts:    " + std::to_string(n) + " stacked tensors, " + human_bytes(bytes);
  if (ep > 1) o += "; ep=" + std::to_string(ep) + ": " + human_bytes(bytes / static_cast<uint64_t>(ep)) + " per expert rank";
  return o + "\n";
}

}  // namespace

std::string text_summary(const json& s, bool list_tensors) {
  std::string o;
  char buf[512];
  o += "checkpoint: " + s.value("path", std::string()) + "\n";
  if (!s.value("format", std::string()).empty()) o += "format:     " + s["format"].get<std::string>() + "\n";
  if (!s["step"].is_null()) o += "step:       " + s["step"].dump() + "\n";
  if (!s["profile"].is_null()) o += "profile:    " + (s["profile"].is_string() ? s["profile"].get<std::string>() : s["profile"].dump()) + "\n";
  if (s.contains("exactness") && s["exactness"].is_object()) {
    const json& x = s["exactness"];
    uint64_t changed = 0, clamped = 0;
    if (x.contains("steps") && x["steps"].is_array())
      for (const json& st : x["steps"])
        if (st.is_object()) {
          changed += st.value("changed", uint64_t{0});
          clamped += st.value("clamped", uint64_t{0});
        }
    o += "exactness:  converted from " + x.value("from_profile", std::string("?")) + ": " +
         (x.value("exact", false) ? std::string("exact") : std::to_string(changed) + " values changed, " +
                                                              std::to_string(clamped) + " clamped") + "\n";
  }
  const json& det = s.contains("layout_detail") ? s["layout_detail"] : json(nullptr);
  if (det.is_object() && det.value("form", std::string()) == "general") {
    o += layout_detail_text(det);
  } else if (s["layout"].is_object()) {
    o += "layout:    ";
    for (const char* k : {"tp", "pp", "dp", "zero", "ep", "etp"})
      if (s["layout"].contains(k)) o += std::string(" ") + k + "=" + s["layout"][k].dump();
    o += "\n";
  } else if (!s["layout"].is_null()) {
    o += "layout:     " + s["layout"].dump() + "\n";
  }
  o += experts_text(s);
  if (list_tensors) {
    std::snprintf(buf, sizeof buf, "%-56s %-8s %-20s %7s %12s\n", "tensor", "dtype", "shape", "pieces", "bytes");
    o += buf;
    for (const auto& t : s["tensors"]) {
      std::string shape = "[";
      for (size_t i = 0; i < t["shape"].size(); ++i) shape += (i ? "," : "") + t["shape"][i].dump();
      shape += "]";
      std::snprintf(buf, sizeof buf, "%-56s %-8s %-20s %7llu %12s\n", t["name"].get<std::string>().c_str(), t["dtype"].get<std::string>().c_str(),
                    shape.c_str(), static_cast<unsigned long long>(t["pieces"].get<uint64_t>()), human_bytes(t["bytes"].get<uint64_t>()).c_str());
      o += buf;
    }
  }
  const auto& tot = s["totals"];
  std::snprintf(buf, sizeof buf, "totals: %llu tensors, %llu pieces", static_cast<unsigned long long>(tot["tensors"].get<uint64_t>()),
                static_cast<unsigned long long>(tot["pieces"].get<uint64_t>()));
  o += buf;
  if (tot.contains("files")) o += ", " + tot["files"].dump() + " files";
  o += ", " + human_bytes(tot["bytes"].get<uint64_t>()) + " raw";
  if (tot.contains("stored_bytes")) {
    std::snprintf(buf, sizeof buf, ", %s stored, compression ratio %.3f", human_bytes(tot["stored_bytes"].get<uint64_t>()).c_str(),
                  tot["compression_ratio"].get<double>());
    o += buf;
  }
  o += "\n";
  if (s.contains("codecs")) {
    o += "codecs:";
    for (auto it = s["codecs"].begin(); it != s["codecs"].end(); ++it) o += " " + it.key() + " x" + it.value().dump();
    o += "\n";
  }
  return o;
}

SourceExtras extras_of(TensorSource& src, const std::string& format) {
  SourceExtras ex;
  ex.format = format;
  if (src.pieces().empty()) return ex;
  auto st = std::make_shared<std::vector<PieceStorage>>();  // asked once per piece
  for (size_t i = 0; i < src.pieces().size(); ++i) st->push_back(src.piece_storage(i));
  const PieceStorage& first = st->front();
  if (first.stored_bytes) ex.stored_bytes = [st](size_t i) { return (*st)[i].stored_bytes.value_or(0); };
  if (!first.codec.empty()) ex.codec = [st](size_t i) { return (*st)[i].codec; };
  if (!first.file.empty()) ex.file = [st](size_t i) { return (*st)[i].file; };
  return ex;
}

}  // namespace ckpt::store
