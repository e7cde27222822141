// The kernels' fatbins, embedded into the binary at build time (kernels/kernels.cmake generates the
// table), so that loading them needs no file and no nvcc at run time.
#pragma once

#include <cstddef>

namespace rankflow::cuda {

struct KernelImage {
  const char* name;           // the .cu file's stem: "barrier", "all_gather"
  const unsigned char* data;  // a fatbin, for cuModuleLoadData
  std::size_t size;
};

// Every embedded image (count of them in *count); none when the build had no nvcc.
const KernelImage* kernel_images(std::size_t* count);
// How the kernels were built, or why they were not: for doctor and for error messages.
const char* kernel_build_note();
// The image of that name, or nullptr.
const KernelImage* find_kernel_image(const char* name);

}  // namespace rankflow::cuda
