// dist/cuda_communicator: the communicator of a run whose ranks compute on GPUs. It carries host and device buffers
// alike, so the training code calls the same collectives whatever a buffer is (a loss on the host, a gradient
// bucket on the GPU):
// - host buffers (scalars, flags, statistics already on the host) go over the host communicator (MPI);
// - device buffers go over NCCL when the world has it ("nccl"), or are staged ("staged"): copied to page-locked
//   host memory on the compute stream, handed to the host communicator, copied back. Staging is how ranks that
//   share one GPU, or a build without NCCL, still run a CUDA layout; it is also how the CUDA distributed logic is
//   tested on a machine with one GPU (or on the emulated GPU).
// A buffer is a device buffer when core's is_device_pointer says so. The two buffers of one call (send and receive)
// must be of the same kind. Byte counters count payload as the host backends do (dist/communicator.h), whichever
// way it travelled.
#pragma once

#include <memory>
#include <string>

#include "dist/communicator.h"

namespace proplab::dist {

// How device buffers travel between ranks.
enum class DeviceTransport { nccl, staged };
const char* device_transport_name(DeviceTransport transport);

// Wraps a host communicator and, for DeviceTransport::nccl, the NCCL communicator over the same ranks (null for
// staged). split() splits both.
std::unique_ptr<Communicator> make_cuda_communicator(std::unique_ptr<Communicator> host,
                                                     std::unique_ptr<Communicator> nccl);

// What make_cuda_world chose for this rank.
struct CudaRanks {
  DeviceTransport transport = DeviceTransport::staged;
  int local_rank = 0, ranks_on_node = 1, gpus = 0;
  int ordinal = 0;  // the GPU this rank computes on
};

// The world of a CUDA run over `mpi_world` (collective over it), as `parallel.comm` says:
// - "nccl": NCCL for device buffers; each rank computes on the GPU of its node-local rank. UserError (every rank)
//   when this build has no NCCL or a node has more ranks than GPUs.
// - "staged": device buffers through pinned host memory and MPI; rank i of a node computes on GPU i mod gpus, so
//   ranks may share a GPU.
// - "auto": "nccl" when this build has NCCL, else "staged".
// Sets this process's GPU (core's set_cuda_ordinal) before anything else touches CUDA. UserError when the machine
// has no GPU, or for an unknown value (naming parallel.comm).
std::unique_ptr<Communicator> make_cuda_world(std::unique_ptr<Communicator> mpi_world, const std::string& comm,
                                              double timeout_s, CudaRanks* chosen = nullptr);

}  // namespace proplab::dist
