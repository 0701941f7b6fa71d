// The `ckpt._ckpt` extension module (python/ckpt/__init__.py re-exports it as `ckpt`).
#include "python/bindings.h"
#include "python/py_errors.h"

NB_MODULE(_ckpt, m) {
  m.doc() = "ckpt: open, read, reshard, convert and export LLM checkpoints (C++ core)";
  ckpt::py::bind_errors(m);
  ckpt::py::bind_checkpoint(m);
  ckpt::py::bind_commands(m);
}
