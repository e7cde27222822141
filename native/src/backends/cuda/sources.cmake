# The CUDA backend's sources, for the addon's native/CMakeLists.txt. Sets:
#   RF_CUDA_FOUND        cuda.h was found (the backend needs its types; it never links libcuda)
#   RF_CUDA_INCLUDE_DIR  where cuda.h is
#   RF_CUDA_SOURCES      the backend's .cc files plus the generated kernel images (kernels/kernels.cmake)
# Callers add RF_CUDA_SOURCES to a target, RF_CUDA_INCLUDE_DIR, native/src, native/src/runtime and
# kernels/ to its include path, and link ${CMAKE_DL_LIBS} and Threads::Threads.
include_guard(GLOBAL)

set(RF_CUDA_SRC_DIR "${CMAKE_CURRENT_LIST_DIR}")
find_path(RF_CUDA_INCLUDE_DIR cuda.h
  PATHS /usr/local/cuda/include ENV CUDA_HOME ENV CUDA_PATH
  PATH_SUFFIXES include targets/x86_64-linux/include)
if(RF_CUDA_INCLUDE_DIR)
  set(RF_CUDA_FOUND ON)
  include("${RF_CUDA_SRC_DIR}/../../../../kernels/kernels.cmake")
  rankflow_kernel_sources(RF_KERNEL_SOURCES)
  file(GLOB RF_CUDA_BACKEND_SOURCES CONFIGURE_DEPENDS "${RF_CUDA_SRC_DIR}/*.cc")
  set(RF_CUDA_SOURCES ${RF_CUDA_BACKEND_SOURCES} ${RF_KERNEL_SOURCES})
else()
  set(RF_CUDA_FOUND OFF)
  set(RF_CUDA_SOURCES "")
  message(WARNING "rankflow: cuda.h not found (set CUDA_HOME): building without the CUDA backend")
endif()
