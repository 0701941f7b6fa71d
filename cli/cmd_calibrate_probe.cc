// `ckpt calibrate-mpi-probe` (hidden): the rank side of `ckpt plan --calibrate`'s MPI measurement,
// started by trainer/plan/calibrate_probe.h's spawn_mpi_probe under mpirun -np 2.
#include <memory>

#include "cli/commands.h"
#include "trainer/plan/calibrate_probe.h"

namespace ckpt::cli {
namespace {

CommandAction setup_calibrate_probe(CLI::App& sub) {
  auto seconds = std::make_shared<double>(1.0);
  auto threads = std::make_shared<int>(1);
  sub.group("");  // hidden: started by `ckpt plan --calibrate`, not by hand
  sub.add_option("--seconds", *seconds, "Time budget of the measurement");
  sub.add_option("--threads", *threads, "OpenBLAS threads per rank (as `ckpt train --threads`)");
  return [seconds, threads]() -> int {
    Status st = trainer::mpi_probe(*seconds, *threads);
    return st.ok() ? 0 : report_error(st);
  };
}

CKPT_REGISTER_COMMAND("calibrate-mpi-probe", "MPI ping-pong between two ranks (used by `ckpt plan --calibrate`)",
                      setup_calibrate_probe);

}  // namespace
}  // namespace ckpt::cli
