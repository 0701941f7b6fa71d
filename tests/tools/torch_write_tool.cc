// torch_write_tool: writes a torch.save file with ckpt's pickler and TorchFileWriter from a JSON
// description of the object tree, or a DCP directory with DcpWriter, for
// tests/python/test_torch_write.py.
//   torch_write_tool SPEC.json OUT.pt
//   torch_write_tool --dcp SPEC.json OUT_DIR
// DCP SPEC: {"tensors": [{"name", "dtype", "shape", "chunks": [{"offset", "extent", "rank"}]}],
//            "bytes": [{"fqn", "rank", "obj": V}] (each a torch.save of V), "force_zip64": b,
//            "flat_planner_data": b,
//            "slab": elements per write}; element bytes of each global tensor follow the pattern
//            below with k = the tensor's index, in row-major order of the whole tensor.
// SPEC: {"storages": [{"key", "dtype" (safetensors name), "numel"}], "root": V, "force_zip64": b,
//        "slab": bytes per write (storages are written in slabs, interleaved round-robin)}
// V: null | true/false | integer | float | "str" | {"t": "list"|"tuple", "v": [V...]}
//    | {"t": "dict"|"odict"|"ns", "v": [[K, V]...]} (ns: argparse.Namespace(**v))
//    | {"t": "bytes", "hex": "..."} | {"t": "dtype", "v": "torch.float32"}
//    | {"t": "tensor", "storage": key, "offset", "size": [..], "stride": [..], "requires_grad", "param"}
//    | {"t": "ref", "id": N} (the object given "id": N earlier: written once, memoized)
// With "pieces" the storages are filled through TorchFileSink (see write_through_sink).
// Byte j of the storage at index k is (31 j + 17 k + 3) mod 251 ((j + k) mod 2 for BOOL).
// Exit: 0 ok, 3 the writer refused (message on stderr), 2 usage.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/torch/dcp/dcp_writer.h"
#include "formats/torch/torch_file_sink.h"
#include "formats/torch/torch_file_writer.h"

namespace {

using ckpt::torch::PyArena;
using ckpt::torch::PyObj;
using json = nlohmann::json;

struct Builder {
  PyArena arena;
  std::map<std::string, ckpt::torch::StorageRef> storages;
  std::map<int64_t, const PyObj*> ids;

  const PyObj* build(const json& v) {
    const PyObj* o = build_inner(v);
    if (v.is_object() && v.contains("id")) ids[v["id"].get<int64_t>()] = o;
    return o;
  }
  std::vector<std::pair<const PyObj*, const PyObj*>> pairs(const json& v) {
    std::vector<std::pair<const PyObj*, const PyObj*>> e;
    for (const auto& kv : v) e.emplace_back(build(kv[0]), build(kv[1]));
    return e;
  }
  const PyObj* build_inner(const json& v) {
    if (v.is_null()) return arena.none();
    if (v.is_boolean()) return arena.boolean(v.get<bool>());
    if (v.is_number_integer()) return arena.integer(v.get<int64_t>());
    if (v.is_number()) return arena.real(v.get<double>());
    if (v.is_string()) return arena.str(v.get<std::string>());
    std::string t = v.at("t");
    if (t == "ref") return ids.at(v["id"].get<int64_t>());
    if (t == "list" || t == "tuple") {
      std::vector<const PyObj*> items;
      for (const auto& x : v["v"]) items.push_back(build(x));
      return t == "list" ? arena.list(std::move(items)) : arena.tuple(std::move(items));
    }
    if (t == "dict") return arena.dict(pairs(v["v"]));
    if (t == "odict") return arena.ordered_dict(pairs(v["v"]));
    if (t == "ns") return arena.record("argparse.Namespace", arena.tuple({}), arena.dict(pairs(v["v"])), true);
    if (t == "dtype") return arena.record(v["v"].get<std::string>(), nullptr, nullptr);
    if (t == "bytes") {
      std::string hex = v["hex"], b;
      for (size_t i = 0; i + 1 < hex.size(); i += 2) b += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
      return arena.bytes(b);
    }
    if (t == "tensor") {
      ckpt::torch::TensorRef r;
      r.storage = storages.at(v["storage"].get<std::string>());
      r.storage_offset = v.value("offset", 0);
      r.size = v["size"].get<std::vector<int64_t>>();
      r.stride = v["stride"].get<std::vector<int64_t>>();
      r.requires_grad = v.value("requires_grad", false);
      r.is_parameter = v.value("param", false);
      return arena.tensor(r);
    }
    throw std::runtime_error("unknown node type " + t);
  }
};

unsigned char pattern_byte(uint64_t j, uint64_t k, bool boolean) {
  return boolean ? static_cast<unsigned char>((j + k) % 2) : static_cast<unsigned char>((31 * j + 17 * k + 3) % 251);
}

ckpt::Status write_dcp(const json& spec, const std::string& out) {
  using namespace ckpt;
  std::vector<TensorMeta> tensors;
  std::vector<Piece> pieces;
  torch::DcpWriterOptions opts;
  opts.fsync = false;
  opts.force_zip64 = spec.value("force_zip64", false);
  opts.flat_planner_data = spec.value("flat_planner_data", true);
  std::vector<std::string> globals;  // each tensor's pattern bytes
  for (const auto& t : spec["tensors"]) {
    auto dt = dtype_from_name(t["dtype"].get<std::string>());
    if (!dt.ok()) return dt.status();
    Shape shape = t["shape"].get<Shape>();
    tensors.push_back(TensorMeta{t["name"], *dt, shape});
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::string g(static_cast<size_t>(n) * dtype_size(*dt), '\0');
    for (size_t j = 0; j < g.size(); ++j) g[j] = static_cast<char>(pattern_byte(j, globals.size(), *dt == DType::kBool));
    globals.push_back(std::move(g));
    for (const auto& c : t["chunks"]) {
      pieces.push_back(Piece{t["name"], Region{Box{c["offset"].get<Shape>(), c["extent"].get<Shape>()}}, *dt});
      opts.piece_rank.push_back(c.value("rank", 0));
    }
  }
  for (const auto& b : spec.value("bytes", json::array())) {
    Builder bld;
    auto data = torch::torch_save_bytes(bld.build(b["obj"]));
    if (!data.ok()) return data.status();
    opts.bytes.push_back(torch::DcpBytesEntry{b["fqn"], *data, b.value("rank", 0)});
  }
  torch::DcpWriter w(out, opts);
  CKPT_RETURN_IF_ERROR(w.begin(tensors, pieces, json::object()));
  int64_t slab = spec.value("slab", int64_t{1} << 20);
  std::vector<size_t> order = w.write_order();
  std::reverse(order.begin(), order.end());  // not the file order: pwrite in place anyway
  for (size_t i : order) {
    const Piece& p = pieces[i];
    size_t ti = 0;
    while (tensors[ti].name != p.tensor) ++ti;
    size_t es = dtype_size(p.dtype);
    std::string buf(static_cast<size_t>(p.region.box.numel()) * es, '\0');
    copy_box(globals[ti].data(), Box::whole(tensors[ti].shape), buf.data(), p.region.box, p.region.box, es);
    for (int64_t done = 0; done < p.region.box.numel();) {
      int64_t n = std::min(slab, p.region.box.numel() - done);
      CKPT_RETURN_IF_ERROR(w.write(i, buf.data() + done * es, n));
      done += n;
    }
  }
  return w.commit();
}

// Through TorchFileSink: spec "pieces": [{"storage": index, "first": element, "count": n}], each
// a 1-D piece, written in reverse declaration order in slabs of "slab" elements.
ckpt::Status write_through_sink(const json& spec, const PyObj* root, const std::vector<ckpt::torch::TorchStorage>& storages,
                                const ckpt::torch::TorchWriteOptions& opts, const std::string& out) {
  using namespace ckpt;
  std::vector<TensorMeta> tensors;
  std::vector<Piece> pieces;
  std::vector<torch::TorchSinkSlot> slots;
  for (const auto& p : spec["pieces"]) {
    size_t k = p["storage"];
    int64_t n = p["count"];
    std::string name = "p" + std::to_string(pieces.size());
    tensors.push_back(TensorMeta{name, storages.at(k).dtype, {n}});
    pieces.push_back(Piece{name, Region{Box::whole({n})}, storages[k].dtype});
    slots.push_back(torch::TorchSinkSlot{k, p["first"].get<int64_t>()});
  }
  torch::TorchFileSink sink(out, root, storages, slots, opts);
  CKPT_RETURN_IF_ERROR(sink.begin(tensors, pieces, json::object()));
  int64_t slab = spec.value("slab", int64_t{1} << 20);
  for (size_t i = pieces.size(); i-- > 0;) {
    size_t k = slots[i].storage, es = dtype_size(storages[k].dtype);
    int64_t n = pieces[i].region.numel();
    for (int64_t done = 0; done < n;) {
      int64_t c = std::min(slab, n - done);
      std::string buf(static_cast<size_t>(c) * es, '\0');
      uint64_t first_byte = static_cast<uint64_t>(slots[i].first_element + done) * es;
      for (size_t j = 0; j < buf.size(); ++j) buf[j] = static_cast<char>(pattern_byte(first_byte + j, k, storages[k].dtype == DType::kBool));
      CKPT_RETURN_IF_ERROR(sink.write(i, buf.data(), c));
      done += c;
    }
  }
  return sink.commit();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--dcp") {
    std::ifstream in(argv[2]);
    ckpt::Status st = write_dcp(json::parse(in), argv[3]);
    if (!st.ok()) std::fprintf(stderr, "torch_write_tool: %s\n", st.to_string().c_str());
    return st.ok() ? 0 : 3;
  }
  if (argc != 3) {
    std::fprintf(stderr, "usage: torch_write_tool SPEC.json OUT.pt | --dcp SPEC.json OUT_DIR\n");
    return 2;
  }
  std::ifstream in(argv[1]);
  json spec = json::parse(in);
  Builder b;
  std::vector<ckpt::torch::TorchStorage> storages;
  for (const auto& s : spec["storages"]) {
    auto dt = ckpt::dtype_from_name(s["dtype"].get<std::string>());
    if (!dt.ok()) return 2;
    ckpt::torch::TorchStorage ts{s["key"], *dt, s["numel"]};
    storages.push_back(ts);
    b.storages[ts.key] = ckpt::torch::StorageRef{ts.key, ts.dtype, ts.numel, "cpu"};
  }
  const PyObj* root = b.build(spec["root"]);
  ckpt::torch::TorchWriteOptions opts;
  opts.force_zip64 = spec.value("force_zip64", false);
  opts.fsync = false;
  if (spec.contains("pieces")) {
    ckpt::Status st = write_through_sink(spec, root, storages, opts, argv[2]);
    if (!st.ok()) std::fprintf(stderr, "torch_write_tool: %s\n", st.to_string().c_str());
    return st.ok() ? 0 : 3;
  }
  ckpt::torch::TorchFileWriter w(argv[2], opts);
  ckpt::Status st = w.begin(root, storages);
  uint64_t slab = spec.value("slab", uint64_t{1} << 20);
  std::vector<uint64_t> done(storages.size(), 0);
  for (bool more = true; st.ok() && more;) {  // round-robin slabs over the storages
    more = false;
    for (size_t k = 0; k < storages.size() && st.ok(); ++k) {
      uint64_t total = static_cast<uint64_t>(storages[k].numel) * ckpt::dtype_size(storages[k].dtype);
      uint64_t n = std::min(slab, total - done[k]);
      if (n == 0) continue;
      std::string buf(n, '\0');
      for (uint64_t j = 0; j < n; ++j) buf[j] = static_cast<char>(pattern_byte(done[k] + j, k, storages[k].dtype == ckpt::DType::kBool));
      st = w.write(k, buf.data(), n);
      done[k] += n;
      more = true;
    }
  }
  if (st.ok()) st = w.commit();
  if (!st.ok()) {
    std::fprintf(stderr, "torch_write_tool: %s\n", st.to_string().c_str());
    return 3;
  }
  std::printf("{\"bytes\": %llu}\n", static_cast<unsigned long long>(w.file_size()));
  return 0;
}
