// torch_dump: reads a torch.save zip (or, with --pickle, a bare pickle such as a DCP .metadata)
// through formats/torch and prints the object tree as JSON; with OUT_DIR, writes every tensor's
// elements (dense row-major, read through TorchFile::read_tensor) to OUT_DIR/<n>.bin, so
// tests/python/test_torch_read.py can compare them with torch.load.
//   torch_dump FILE [OUT_DIR] [--pickle] [--offset N] [--length N] [--halves]
// --halves: also writes <n>.half.bin, the sub-box [size/2 : size] of every dimension (a sub-box
// read through read_tensor, as resharding does).
// --extents: when TorchFile::tensor_extent offers the whole tensor as a range of the file, also
// writes <n>.bin.extent, those bytes read straight from the file, and adds "extent": [offset,
// bytes] to the tensor's JSON.
// JSON: None/bool/int/str as themselves; float {"float": x} (x "nan"/"inf"/"-inf" when not finite);
// bytes {"bytes": hex}; {"list": [...]}, {"tuple": [...]}, {"dict": [[k, v], ...]};
// {"tensor": {dtype, size, stride, offset, key, numel, requires_grad, parameter, file}};
// {"storage": {...}}; {"record": cls, "args": ..., "state": ...}.
// Exit codes as the ckpt CLI's: 3 corruption, 4 I/O, 5 unsupported, 2 usage.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/base/file_io.h"
#include "formats/torch/pickle/unpickler.h"
#include "formats/torch/torch_file.h"

using namespace ckpt;
using namespace ckpt::torch;
using json = nlohmann::json;

namespace {

struct Dumper {
  TorchFile* file = nullptr;
  std::string out_dir;
  bool halves = false;
  bool extents = false;
  int next = 0;
  long budget = 2000000;
  Status st;

  json storage_json(const StorageRef& s) {
    return json{{"key", s.key}, {"dtype", std::string(dtype_name(s.dtype))}, {"numel", s.numel}, {"location", s.location}};
  }
  json tensor_json(const TensorRef& t) {
    json j = storage_json(t.storage);
    j["size"] = t.size;
    j["stride"] = t.stride;
    j["offset"] = t.storage_offset;
    j["requires_grad"] = t.requires_grad;
    j["parameter"] = t.is_parameter;
    if (file != nullptr && !out_dir.empty() && st.ok()) {
      int64_t n = 1;
      for (int64_t d : t.size) n *= d;
      std::vector<char> buf(static_cast<size_t>(n) * dtype_size(t.storage.dtype));
      st = file->read_tensor(t, Box::whole(t.size), buf.data());
      std::string name = std::to_string(next++) + ".bin";
      std::ofstream(out_dir + "/" + name, std::ios::binary).write(buf.data(), static_cast<std::streamsize>(buf.size()));
      j["file"] = name;
      if (extents && st.ok())
        if (std::optional<FileExtent> e = file->tensor_extent(t, Box::whole(t.size))) {
          std::vector<char> eb(e->bytes);
          st = pread_full(e->fd, eb.data(), e->bytes, e->offset, file->path());
          std::ofstream(out_dir + "/" + name + ".extent", std::ios::binary).write(eb.data(), static_cast<std::streamsize>(eb.size()));
          j["extent"] = {e->offset, e->bytes};
        }
      if (halves && st.ok()) {
        Box sub = Box::whole(t.size);
        for (size_t d = 0; d < sub.ndim(); ++d) {
          sub.offset[d] = t.size[d] / 2;
          sub.extent[d] = t.size[d] - t.size[d] / 2;
        }
        std::vector<char> hb(static_cast<size_t>(sub.numel()) * dtype_size(t.storage.dtype));
        st = file->read_tensor(t, sub, hb.data());
        std::ofstream(out_dir + "/" + name + ".half", std::ios::binary).write(hb.data(), static_cast<std::streamsize>(hb.size()));
      }
    }
    return j;
  }
  json dump(const PyObj* o, int depth) {
    if (o == nullptr) return nullptr;
    if (--budget < 0 || depth > 500) return "...";
    switch (o->type) {
      case PyType::kNone: return nullptr;
      case PyType::kBool: return o->b;
      case PyType::kInt: return o->i;
      case PyType::kFloat:
        if (std::isnan(o->f)) return json{{"float", "nan"}};
        if (std::isinf(o->f)) return json{{"float", o->f > 0 ? "inf" : "-inf"}};
        return json{{"float", o->f}};
      case PyType::kStr: return o->s;
      case PyType::kBytes: {
        std::string hex;
        char b[3];
        for (unsigned char c : o->s) {
          std::snprintf(b, sizeof b, "%02x", c);
          hex += b;
        }
        return json{{"bytes", hex}};
      }
      case PyType::kList:
      case PyType::kTuple: {
        json a = json::array();
        for (const PyObj* i : o->items) a.push_back(dump(i, depth + 1));
        return json{{o->is(PyType::kList) ? "list" : "tuple", a}};
      }
      case PyType::kDict: {
        json a = json::array();
        for (const auto& [k, v] : o->entries) a.push_back(json::array({dump(k, depth + 1), dump(v, depth + 1)}));
        return json{{"dict", a}};
      }
      case PyType::kStorage: return json{{"storage", storage_json(o->storage)}};
      case PyType::kTensor: return json{{"tensor", tensor_json(o->tensor)}};
      case PyType::kRecord: return json{{"record", o->cls}, {"args", dump(o->args, depth + 1)}, {"state", dump(o->state, depth + 1)}};
    }
    return nullptr;
  }
};

int exit_for(const Status& s) {
  std::fprintf(stderr, "torch_dump: %s\n", s.to_string().c_str());
  switch (s.kind()) {
    case ErrorKind::kInvalidArgument: return 2;
    case ErrorKind::kCorruption: case ErrorKind::kOverflow: return 3;
    case ErrorKind::kIo: case ErrorKind::kNotFound: return 4;
    case ErrorKind::kUnsupported: return 5;
    default: return 70;
  }
}

}  // namespace

int main(int argc, char** argv) {
  Dumper d;
  std::vector<std::string> pos;
  bool pickle_only = false;
  uint64_t offset = 0, length = UINT64_MAX;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--pickle") pickle_only = true;
    else if (a == "--halves") d.halves = true;
    else if (a == "--extents") d.extents = true;
    else if (a == "--offset" && i + 1 < argc) offset = std::stoull(argv[++i]);
    else if (a == "--length" && i + 1 < argc) length = std::stoull(argv[++i]);
    else pos.push_back(a);
  }
  if (pos.empty()) {
    std::fprintf(stderr, "usage: torch_dump FILE [OUT_DIR] [--pickle] [--offset N] [--length N] [--halves] [--extents]\n");
    return 2;
  }
  if (pos.size() > 1) d.out_dir = pos[1];
  if (pickle_only) {
    std::ifstream in(pos[0], std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    auto p = unpickle(ss.str());
    if (!p.ok()) return exit_for(p.status());
    std::printf("%s\n", d.dump(p->root, 0).dump().c_str());
    return 0;
  }
  auto f = TorchFile::open(pos[0], offset, length);
  if (!f.ok()) return exit_for(f.status());
  d.file = f->get();
  json j = d.dump((*f)->root(), 0);
  if (!d.st.ok()) return exit_for(d.st);
  std::printf("%s\n", j.dump().c_str());
  return 0;
}
