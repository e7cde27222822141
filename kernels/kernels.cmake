# The CUDA kernels, compiled by nvcc into one fatbin per kernel (machine code for each chosen GPU
# architecture + PTX of the newest, so later GPUs JIT it) and embedded into whatever target links
# the sources this returns.
#   include(<repo>/kernels/kernels.cmake)
#   rankflow_kernel_sources(RF_KERNEL_SOURCES)      # generated .cc files, add them to the target
# Without nvcc the build goes on with no kernels; kernel_images() is then empty and the build note
# (kernel_build_note(), shown by doctor) says why.
#
# Architectures, first found wins: the cmake variable RF_CUDA_ARCHS (cmake-js: --CDRF_CUDA_ARCHS=80;90),
# the environment variable RANKFLOW_CUDA_ARCHS (`RANKFLOW_CUDA_ARCHS=90 npm install`), else the
# datacenter GPUs the kernels run on: 80 (A100), 90 (H100/H200), 100 (B200), each only where the
# nvcc found can build it (`nvcc --list-gpu-arch`). A list may use ';' or ',' and 'sm_' prefixes.
include_guard(GLOBAL)

set(RF_KERNELS_DIR "${CMAKE_CURRENT_LIST_DIR}")
set(RF_KERNEL_NAMES barrier all_gather notify dispatch combine combine_local session engram graph busy two_level)
set(RF_CUDA_ARCHS "" CACHE STRING "GPU architectures for the kernels (e.g. 80;90;100); empty: RANKFLOW_CUDA_ARCHS, else 80;90;100 as nvcc allows")
# The single architecture of earlier builds; a build folder configured then would still hold it.
unset(RF_CUDA_ARCH CACHE)
option(RF_WITH_KERNELS "compile and embed the CUDA kernels when nvcc is found" ON)
if(RF_WITH_KERNELS)
  find_program(RF_NVCC nvcc PATHS /usr/local/cuda/bin ENV CUDA_HOME PATH_SUFFIXES bin)
else()
  unset(RF_NVCC)
  unset(RF_NVCC CACHE)
endif()

# The architectures to build, as plain numbers in ascending order (see the top of this file).
function(rankflow_cuda_archs out_var)
  if(NOT RF_CUDA_ARCHS STREQUAL "")
    set(requested "${RF_CUDA_ARCHS}")
    set(origin "RF_CUDA_ARCHS")
  elseif(NOT "$ENV{RANKFLOW_CUDA_ARCHS}" STREQUAL "")
    set(requested "$ENV{RANKFLOW_CUDA_ARCHS}")
    set(origin "RANKFLOW_CUDA_ARCHS")
  else()
    set(requested "80;90;100")
    set(origin "")
  endif()
  string(REGEX REPLACE "[ ,]+" ";" requested "${requested}")
  string(REGEX REPLACE "(sm_|compute_)" "" requested "${requested}")
  list(REMOVE_ITEM requested "")
  execute_process(COMMAND "${RF_NVCC}" --list-gpu-arch OUTPUT_VARIABLE listed RESULT_VARIABLE listed_rc ERROR_QUIET)
  set(archs "")
  foreach(arch IN LISTS requested)
    if(NOT arch MATCHES "^[0-9]+[af]?$")
      message(FATAL_ERROR "rankflow kernels: '${arch}' in ${origin} is not a GPU architecture (expected e.g. 80;90;100)")
    endif()
    if(listed_rc EQUAL 0 AND NOT listed MATCHES "compute_${arch}([^0-9a-z]|$)")
      if(origin STREQUAL "")
        message(STATUS "rankflow kernels: nvcc at ${RF_NVCC} cannot build sm_${arch}; left out")
        continue()
      endif()
      message(FATAL_ERROR "rankflow kernels: ${origin} asks for sm_${arch}, which nvcc at ${RF_NVCC} cannot build (nvcc --list-gpu-arch)")
    endif()
    list(APPEND archs "${arch}")
  endforeach()
  if(archs STREQUAL "")
    message(FATAL_ERROR "rankflow kernels: no GPU architecture to build for (${origin}: '${requested}')")
  endif()
  list(REMOVE_DUPLICATES archs)
  list(SORT archs COMPARE NATURAL)
  set(${out_var} "${archs}" PARENT_SCOPE)
endfunction()

function(rankflow_kernel_sources out_var)
  set(gen_dir "${CMAKE_CURRENT_BINARY_DIR}/kernels")
  file(MAKE_DIRECTORY "${gen_dir}")
  set(sources "")
  set(entries "")
  set(decls "")
  if(RF_NVCC)
    execute_process(COMMAND "${RF_NVCC}" --version OUTPUT_VARIABLE nvcc_version)
    string(REGEX MATCH "release [0-9]+\\.[0-9]+" nvcc_release "${nvcc_version}")
    rankflow_cuda_archs(archs)
    # PTX of the newest portable architecture: an arch-specific one (90a) would not JIT elsewhere.
    list(GET archs -1 ptx_arch)
    foreach(arch IN LISTS archs)
      if(arch MATCHES "^[0-9]+$")
        set(ptx_arch "${arch}")
      endif()
    endforeach()
    set(gencode "")
    set(sass "")
    foreach(arch IN LISTS archs)
      list(APPEND gencode -gencode arch=compute_${arch},code=sm_${arch})
      list(APPEND sass "sm_${arch}")
    endforeach()
    list(APPEND gencode -gencode arch=compute_${ptx_arch},code=compute_${ptx_arch})
    list(JOIN sass ", " sass_text)
    set(note "built by nvcc ${nvcc_release} for ${sass_text} (+ compute_${ptx_arch} PTX)")
    message(STATUS "rankflow kernels: ${note} (${RF_NVCC})")
    foreach(name IN LISTS RF_KERNEL_NAMES)
      set(fatbin "${gen_dir}/${name}.fatbin")
      set(image "${gen_dir}/${name}_image.cc")
      add_custom_command(
        OUTPUT "${fatbin}"
        COMMAND "${RF_NVCC}" -O3 -std=c++17 -fatbin
                ${gencode}
                -Werror all-warnings
                -o "${fatbin}" "${RF_KERNELS_DIR}/${name}.cu"
        DEPENDS "${RF_KERNELS_DIR}/${name}.cu" "${RF_KERNELS_DIR}/common.cuh"
                "${RF_KERNELS_DIR}/moe.cuh" "${RF_KERNELS_DIR}/notify.cuh" "${RF_KERNELS_DIR}/args.hpp" "${RF_KERNELS_DIR}/protocol.hpp"
        COMMENT "nvcc ${name}.cu -> ${sass_text} fatbin"
        VERBATIM)
      add_custom_command(
        OUTPUT "${image}"
        COMMAND "${CMAKE_COMMAND}" -DIN=${fatbin} -DOUT=${image} -DNAME=${name}
                -P "${RF_KERNELS_DIR}/embed.cmake"
        DEPENDS "${fatbin}" "${RF_KERNELS_DIR}/embed.cmake"
        COMMENT "embed ${name}.fatbin"
        VERBATIM)
      list(APPEND sources "${image}")
      string(APPEND decls
        "extern const unsigned char rf_kernel_image_${name}[];\n"
        "extern const std::size_t rf_kernel_image_${name}_size;\n")
      string(APPEND entries "    {\"${name}\", rf_kernel_image_${name}, 0},\n")
    endforeach()
  else()
    if(RF_WITH_KERNELS)
      set(note "not built: nvcc was not found at build time (install the CUDA toolkit or put nvcc on PATH, then rebuild)")
    else()
      set(note "not built: the build was configured with RF_WITH_KERNELS=OFF")
    endif()
    message(WARNING "rankflow kernels: ${note}")
  endif()
  list(LENGTH RF_KERNEL_NAMES count)
  if(NOT RF_NVCC)
    set(count 0)
  endif()
  # The table: sizes are filled at static initialisation from the *_size symbols (they live in
  # other translation units, so they are not constant expressions here).
  set(sizes "")
  if(RF_NVCC)
    set(i 0)
    foreach(name IN LISTS RF_KERNEL_NAMES)
      string(APPEND sizes "    images[${i}].size = rf_kernel_image_${name}_size;\n")
      math(EXPR i "${i} + 1")
    endforeach()
  endif()
  set(table "${gen_dir}/kernel_table.cc")
  file(WRITE "${table}.in"
"// Generated by kernels/kernels.cmake: the embedded kernel images. Do not edit.\n"
"#include <cstddef>\n"
"#include \"backends/cuda/kernel_images.hpp\"\n"
"${decls}"
"namespace rankflow::cuda {\n"
"namespace {\n"
"KernelImage* table() {\n"
"  static KernelImage images[] = {\n${entries}    {nullptr, nullptr, 0},\n  };\n"
"  static bool filled = [] {\n${sizes}    return true;\n  }();\n"
"  (void)filled;\n"
"  return images;\n"
"}\n"
"}  // namespace\n"
"const KernelImage* kernel_images(std::size_t* count) {\n"
"  if (count != nullptr) *count = ${count};\n"
"  return table();\n"
"}\n"
"const char* kernel_build_note() { return \"${note}\"; }\n"
"}  // namespace rankflow::cuda\n")
  configure_file("${table}.in" "${table}" COPYONLY)
  list(APPEND sources "${table}")
  set(${out_var} "${sources}" PARENT_SCOPE)
endfunction()
