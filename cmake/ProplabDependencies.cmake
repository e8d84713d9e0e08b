# Every external dependency of proplab, found once here.
# OpenBLAS, preferably its OpenMP build: then BLAS calls run on the same OpenMP thread pool as proplab's own
# loops. With the pthread build the two pools fight over the cores (spinning OpenMP workers against yielding
# OpenBLAS threads): measured at about a third of a training step lost on 2 cores.
set(PROPLAB_OPENBLAS_OPENMP_DIR "/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp")
if(EXISTS "${PROPLAB_OPENBLAS_OPENMP_DIR}/libopenblas.so")
  list(PREPEND CMAKE_LIBRARY_PATH "${PROPLAB_OPENBLAS_OPENMP_DIR}")
  set(PROPLAB_OPENBLAS_FLAVOUR openmp)
else()
  set(PROPLAB_OPENBLAS_FLAVOUR pthread)
  message(WARNING "proplab: OpenBLAS's OpenMP build was not found (Debian: libopenblas-openmp-dev); using the "
                  "default build, whose thread pool competes with OpenMP's: expect slower training")
endif()
# A build folder configured before the OpenMP build was installed keeps the other one cached: look again.
foreach(cached BLAS_openblas_LIBRARY PROPLAB_OPENBLAS_INCLUDE)
  if(DEFINED CACHE{${cached}} AND PROPLAB_OPENBLAS_FLAVOUR STREQUAL "openmp" AND NOT ${cached} MATCHES "openblas-openmp")
    unset(${cached} CACHE)
  endif()
endforeach()
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
message(STATUS "proplab: BLAS ${BLAS_LIBRARIES} (${PROPLAB_OPENBLAS_FLAVOUR})")
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(HDF5 REQUIRED COMPONENTS C)
find_package(tomlplusplus REQUIRED)
find_package(CLI11 REQUIRED)
find_package(Threads REQUIRED)
# MPI (Open MPI): the dist module's MPI backend and multi-process tests; without it proplab runs single-process.
find_package(MPI QUIET COMPONENTS C)
find_program(PROPLAB_MPIEXEC NAMES mpirun mpiexec)
if(PROPLAB_TESTS)
  find_package(GTest REQUIRED)
endif()
if(PROPLAB_BENCH)
  find_package(benchmark QUIET)
endif()

# OpenBLAS's own header (cblas.h + openblas_set_num_threads).
find_path(PROPLAB_OPENBLAS_INCLUDE cblas.h
  HINTS /usr/include/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-${PROPLAB_OPENBLAS_FLAVOUR}
        /usr/include/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-pthread /usr/include/openblas /usr/include
  REQUIRED)

add_library(proplab_hdf5 INTERFACE)
target_include_directories(proplab_hdf5 INTERFACE ${HDF5_INCLUDE_DIRS})
target_link_libraries(proplab_hdf5 INTERFACE ${HDF5_C_LIBRARIES})
target_compile_definitions(proplab_hdf5 INTERFACE ${HDF5_DEFINITIONS})

# CUDA: AUTO builds kernels/ whenever nvcc is found; ON requires it; OFF never looks. EMULATE builds kernels/ as host
# C++ against an emulated GPU (kernels/emulation: fake cudart and cuBLASLt, fibers for the threads of a block): it
# needs only the CUDA headers, and PROPLAB_HAVE_CUDA holds for the rest of the build (NCCL is emulated too, below).
# PROPLAB_CUDART names what links the CUDA runtime: CUDA::cudart, or proplab_cuda_emu when emulated.
set(PROPLAB_HAVE_CUDA OFF)
set(PROPLAB_CUDA_EMULATED OFF)
if(PROPLAB_CUDA STREQUAL "EMULATE")
  find_path(PROPLAB_CUDA_INCLUDE cuda_runtime_api.h
    HINTS ${CUDAToolkit_ROOT}/include $ENV{CUDA_PATH}/include /usr/local/cuda/include /usr/include)
  if(NOT PROPLAB_CUDA_INCLUDE OR NOT EXISTS "${PROPLAB_CUDA_INCLUDE}/cublasLt.h")
    message(FATAL_ERROR "PROPLAB_CUDA=EMULATE needs the CUDA toolkit's headers (cuda_runtime_api.h, cublasLt.h); "
                        "none were found (set CUDAToolkit_ROOT)")
  endif()
  set(PROPLAB_HAVE_CUDA ON)
  set(PROPLAB_CUDA_EMULATED ON)
  set(PROPLAB_CUDART proplab_cuda_emu)
elseif(NOT PROPLAB_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # One architecture by default, Hopper (H100/H200), so that a build (and CI, which has no GPU) compiles every
    # kernel once; another GPU: -DCMAKE_CUDA_ARCHITECTURES=80 (A100), 89 (L40), native (the GPU in this machine).
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90-real)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(PROPLAB_HAVE_CUDA ON)
    set(PROPLAB_CUDART CUDA::cudart)
  elseif(PROPLAB_CUDA STREQUAL "ON")
    message(FATAL_ERROR "PROPLAB_CUDA=ON but no CUDA compiler (nvcc) was found; install the CUDA toolkit or use -DPROPLAB_CUDA=OFF")
  endif()
endif()
if(PROPLAB_CUDA_EMULATED)
  message(STATUS "proplab: CUDA backend EMULATED (host, headers ${PROPLAB_CUDA_INCLUDE})")
else()
  message(STATUS "proplab: CUDA backend ${PROPLAB_HAVE_CUDA}")
endif()
message(STATUS "proplab: MPI backend ${MPI_C_FOUND}")
# NCCL (the dist module's GPU backend) ships with the CUDA toolkit here; built when CUDA is. On the emulated GPU it
# is emulated over MPI (kernels/emulation/nccl.cpp, against the real nccl.h): built when MPI is found, and then
# PROPLAB_NCCL_LIBRARY names the emulation (proplab_nccl_emu) in place of libnccl.
set(PROPLAB_HAVE_NCCL OFF)
if(PROPLAB_HAVE_CUDA AND NOT PROPLAB_CUDA_EMULATED)
  find_library(PROPLAB_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  find_path(PROPLAB_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  if(PROPLAB_NCCL_LIBRARY AND PROPLAB_NCCL_INCLUDE)
    set(PROPLAB_HAVE_NCCL ON)
  endif()
elseif(PROPLAB_CUDA_EMULATED AND MPI_C_FOUND)
  find_path(PROPLAB_NCCL_INCLUDE nccl.h HINTS ${PROPLAB_CUDA_INCLUDE} /usr/local/cuda/include /usr/include)
  if(PROPLAB_NCCL_INCLUDE)
    set(PROPLAB_HAVE_NCCL ON)
    set(PROPLAB_NCCL_LIBRARY proplab_nccl_emu)
  endif()
endif()
message(STATUS "proplab: NCCL backend ${PROPLAB_HAVE_NCCL}")
