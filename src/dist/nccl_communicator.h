// dist/nccl_communicator: the NCCL backend of dist::Communicator (CUDA device buffers, one GPU per rank).
#pragma once

#include <memory>

#include "dist/communicator.h"

namespace proplab::dist {

// True when this build has the NCCL backend.
bool nccl_available();
// The NCCL world over the same processes as `mpi_world` (which carries the bootstrap): each rank takes the GPU
// of its node-local rank. UserError when a node has more ranks than GPUs, or when this build has no NCCL.
std::unique_ptr<Communicator> make_nccl_world(Communicator& mpi_world, double timeout_s);

}  // namespace proplab::dist
