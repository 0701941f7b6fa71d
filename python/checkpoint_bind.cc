// The low-level classes under ckpt.open() (python/ckpt/checkpoint.py builds the Checkpoint object
// on them):
//   _ckpt._open(path) -> _Checkpoint            any kind converters/source/open_checkpoint.h reads
//   _Checkpoint.path, .kind, .closed, .tensors() -> [(name, numpy dtype name, shape)],
//     .require(name) (raises NotFoundError naming a tensor the checkpoint lacks),
//     .metadata_json() -> str, .close(),
//     .read_into(name, offset, extent, flat_begin, flat_end, dtype, out, saturate)
//         fills `out` (a C-contiguous uint8 array of exactly the region's bytes in `dtype`) with
//         the region (a box, or the flat range [flat_begin, flat_end) of it; flat_end -1: the box)
//     .rank_view(layout_json, rank, profile) -> _RankView
//   _RankView.pieces() -> [(tensor, numpy dtype name, offset, extent, flat_begin, flat_end)],
//     .layout_json() -> str, .read_into(i, dtype, out, saturate)
// Every read and open releases the GIL around the C++ work (no Python object touched meanwhile:
// the buffer pointer and the arguments are taken before); errors raise the classes of py_errors.h.
#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "python/bindings.h"
#include "python/checkpoint_core.h"
#include "python/py_errors.h"

namespace ckpt::py {

namespace {

using ByteBuffer = nb::ndarray<uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using PieceTuple = std::tuple<std::string, std::string, std::vector<int64_t>, std::vector<int64_t>, int64_t, int64_t>;

struct PyCheckpointHandle {
  std::shared_ptr<CheckpointCore> core;
};

struct PyRankViewHandle {
  std::unique_ptr<RankView> view;
};

CastOptions cast_options(bool saturate) {
  CastOptions c;
  c.overflow = saturate ? OverflowPolicy::kSaturate : OverflowPolicy::kError;
  return c;
}

Region make_py_region(const std::vector<int64_t>& offset, const std::vector<int64_t>& extent, int64_t fb, int64_t fe) {
  Region r;
  r.box = Box{offset, extent};
  if (fe >= 0) {
    r.flat_begin = fb;
    r.flat_end = fe;
  }
  return r;
}

PyCheckpointHandle py_open(const std::string& path) {
  Result<std::shared_ptr<CheckpointCore>> r = Status::Internal("not opened");
  {
    nb::gil_scoped_release release;
    r = CheckpointCore::open(path);
  }
  return PyCheckpointHandle{unwrap(std::move(r))};
}

std::vector<std::tuple<std::string, std::string, std::vector<int64_t>>> py_tensors(const PyCheckpointHandle& h) {
  std::vector<std::tuple<std::string, std::string, std::vector<int64_t>>> out;
  out.reserve(h.core->tensors().size());
  for (const TensorMeta& t : h.core->tensors()) out.emplace_back(t.name, numpy_dtype_name(t.dtype), t.shape);
  return out;
}

void py_read_into(PyCheckpointHandle& h, const std::string& name, const std::vector<int64_t>& offset,
                  const std::vector<int64_t>& extent, int64_t flat_begin, int64_t flat_end, const std::string& dtype,
                  ByteBuffer out, bool saturate) {
  const DType dt = unwrap(dtype_from_any_name(dtype));
  const Region region = make_py_region(offset, extent, flat_begin, flat_end);
  void* dst = out.data();
  const size_t bytes = out.size();
  const CastOptions cast = cast_options(saturate);
  Status st;
  {
    nb::gil_scoped_release release;
    st = h.core->read(name, region, dt, dst, bytes, cast);
  }
  check(st);
}

PyRankViewHandle py_rank_view(PyCheckpointHandle& h, const std::string& layout_json, int rank, const std::string& profile) {
  nlohmann::json layout = nlohmann::json::parse(layout_json, nullptr, false);
  if (layout.is_discarded()) raise_status(Status::InvalidArgument("layout is not JSON: " + layout_json));
  Result<std::unique_ptr<RankView>> r = Status::Internal("not planned");
  {
    nb::gil_scoped_release release;
    r = RankView::make(h.core, layout, rank, profile);
  }
  return PyRankViewHandle{unwrap(std::move(r))};
}

std::vector<PieceTuple> py_view_pieces(const PyRankViewHandle& v) {
  std::vector<PieceTuple> out;
  for (const Piece& p : v.view->pieces()) {
    DType dt = p.dtype;
    for (const TensorMeta& t : v.view->tensors())
      if (t.name == p.tensor) dt = t.dtype;
    out.emplace_back(p.tensor, numpy_dtype_name(dt), p.region.box.offset, p.region.box.extent,
                     p.region.is_flat() ? p.region.flat_begin : 0, p.region.is_flat() ? p.region.flat_end : -1);
  }
  return out;
}

void py_view_read_into(PyRankViewHandle& v, size_t i, const std::string& dtype, ByteBuffer out, bool saturate) {
  const DType dt = unwrap(dtype_from_any_name(dtype));
  void* dst = out.data();
  const size_t bytes = out.size();
  const CastOptions cast = cast_options(saturate);
  Status st;
  {
    nb::gil_scoped_release release;
    st = v.view->read(i, dt, dst, bytes, cast);
  }
  check(st);
}

}  // namespace

void bind_checkpoint(nb::module_& m) {
  nb::class_<PyCheckpointHandle>(m, "_Checkpoint")
      .def_prop_ro("path", [](const PyCheckpointHandle& h) { return h.core->path(); })
      .def_prop_ro("kind", [](const PyCheckpointHandle& h) { return h.core->kind(); })
      .def_prop_ro("closed", [](PyCheckpointHandle& h) { return h.core->closed(); })
      .def("tensors", &py_tensors)
      .def("require",
           [](const PyCheckpointHandle& h, const std::string& name) {
             if (!h.core->find(name))
               raise_status(Status::NotFound("checkpoint '" + h.core->path() + "' has no tensor '" + name + "'")
                                .with_tensor(name)
                                .with_file(h.core->path()));
           })
      .def("metadata_json", [](const PyCheckpointHandle& h) { return h.core->metadata().dump(); })
      .def("close", [](PyCheckpointHandle& h) {
        nb::gil_scoped_release release;
        h.core->close();
      })
      .def("read_into", &py_read_into, nb::arg("name"), nb::arg("offset"), nb::arg("extent"), nb::arg("flat_begin"),
           nb::arg("flat_end"), nb::arg("dtype"), nb::arg("out"), nb::arg("saturate") = false)
      .def("rank_view", &py_rank_view, nb::arg("layout_json"), nb::arg("rank"), nb::arg("profile") = "");
  nb::class_<PyRankViewHandle>(m, "_RankView")
      .def("pieces", &py_view_pieces)
      .def("layout_json", [](const PyRankViewHandle& v) { return v.view->layout().to_json().dump(); })
      .def("read_into", &py_view_read_into, nb::arg("i"), nb::arg("dtype"), nb::arg("out"), nb::arg("saturate") = false);
  m.def("_open", &py_open, nb::arg("path"), "Opens a checkpoint (the low-level handle under ckpt.open).");
  m.def("_dtype_name", [](const std::string& name) { return std::string(numpy_dtype_name(unwrap(dtype_from_any_name(name)))); },
        "The numpy name of a dtype given by any name ckpt knows.");
}

}  // namespace ckpt::py
