// `ckpt train --dump-grads DIR`: the gradients of one step in global view, written as a native
// store checkpoint (tensor names = parameter names, F32, one piece per tensor) so that `ckpt diff`
// compares the gradients of any two layouts. A test aid: every rank sends its gradient regions to
// rank 0 (Comm::gather), which assembles them through the engine (replicas are the same values;
// any one covers) and writes DIR atomically. Memory on rank 0: the whole model's gradients twice.
// Collective over `world`; call from the main thread.
#pragma once

#include <string>
#include <vector>

#include "converters/model/llama_config.h"
#include "formats/base/status.h"
#include "reshard/dist/comm.h"
#include "trainer/optim/zero_optimizer.h"

namespace ckpt::trainer {

Status dump_gradients(Comm& world, const LlamaConfig& cfg, const std::vector<GradRegion<float>>& mine,
                      const std::string& dir);

}  // namespace ckpt::trainer
