// calibrate_tool: trainer/plan/calibrate.h's calibrate_device for tests/python/test_calibrate.py
// (and benchmarks/plan_validate.py before `ckpt plan --calibrate` exists).
//   calibrate_tool CKPT_BIN SECONDS THREADS [nompi]
// prints Calibration::to_json() on one line. CKPT_BIN: the ckpt binary mpirun starts for the MPI
// measurement (its hidden calibrate-mpi-probe command).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "trainer/plan/calibrate.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: calibrate_tool CKPT_BIN SECONDS THREADS [nompi]\n");
    return 2;
  }
  ckpt::trainer::CalibrateOptions o;
  o.exe = argv[1];
  o.seconds = std::atof(argv[2]);
  o.threads = std::atoi(argv[3]);
  o.mpi = !(argc > 4 && std::string(argv[4]) == "nompi");
  auto c = ckpt::trainer::calibrate_device(o);
  if (!c.ok()) {
    std::fprintf(stderr, "calibrate_tool: %s\n", c.status().to_string().c_str());
    return 4;
  }
  std::printf("%s\n", c->to_json().dump().c_str());
  return 0;
}
