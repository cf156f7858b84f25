# check_package.cmake — the installed package and the add_subdirectory use,
# as a user meets them (ctest: cpu.package; .ci/run does the install and the
# example once more with the README's commands).
#   cmake -DFO_BUILD_DIR=<build> -DFO_SOURCE_DIR=<source> -DFO_WORK_DIR=<scratch>
#         -DFO_CXX_COMPILER=... -DFO_CUDA_COMPILER=... [-DFO_CUDA_HOST_COMPILER=...]
#         -DFO_CUDA_ROOT=<toolkit> -P cmake/check_package.cmake
# 1. cmake --install <build> into a prefix, which is then moved: the package
#    must not name the prefix it was installed to, the build or the source;
# 2. examples/cpp configured against the moved prefix (CMAKE_PREFIX_PATH),
#    built and run: exit 0 (without a GPU it prints "no CUDA GPU: nothing to
#    run"; with one it checks its results against cuBLAS + NCCL, and
#    FO_REQUIRE_GPUS > 0 makes "no GPU" a failure, as for the GPU tests);
# 3. a project that adds the source tree with add_subdirectory and does not
#    set CMAKE_CXX_STANDARD compiles against FlashOverlap::flashoverlap and
#    fo_plan (partition.h's defaulted operator== is C++20): the targets carry
#    cxx_std_20. Only its object is built: linking would build the library
#    again (minutes).
cmake_minimum_required(VERSION 3.25)
foreach(v FO_BUILD_DIR FO_SOURCE_DIR FO_WORK_DIR FO_CXX_COMPILER FO_CUDA_COMPILER FO_CUDA_ROOT)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "check_package.cmake: -D${v}=... is required")
  endif()
endforeach()

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "${what} failed (${rc}): ${cmd}\n${out}")
  endif()
  set(run_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${FO_WORK_DIR}")
set(installed "${FO_WORK_DIR}/installed")
set(prefix "${FO_WORK_DIR}/prefix")

# 1. Install, move, look for paths that should not be there.
run("cmake --install" "${CMAKE_COMMAND}" --install "${FO_BUILD_DIR}" --prefix "${installed}")
file(RENAME "${installed}" "${prefix}")
foreach(f lib/libflashoverlap.so include/flashoverlap/flashoverlap.h bin/flashoverlap
          lib/cmake/FlashOverlap/FlashOverlapConfig.cmake lib/cmake/FlashOverlap/FlashOverlapConfigVersion.cmake
          lib/cmake/FlashOverlap/FlashOverlapTargets.cmake)
  if(NOT EXISTS "${prefix}/${f}")
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()
file(GLOB package_files "${prefix}/lib/cmake/FlashOverlap/*.cmake")
foreach(f ${package_files})
  file(READ "${f}" text)
  foreach(p "${installed}" "${FO_BUILD_DIR}" "${FO_SOURCE_DIR}")
    string(FIND "${text}" "${p}" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "${f} names ${p}: the package is not relocatable")
    endif()
  endforeach()
endforeach()
message(STATUS "installed, moved to ${prefix}: no absolute path of the build, the source or the install")

# 2. The example against the moved prefix.
set(example "${FO_WORK_DIR}/example")
run("configuring examples/cpp" "${CMAKE_COMMAND}" -S "${FO_SOURCE_DIR}/examples/cpp" -B "${example}"
    "-DCMAKE_PREFIX_PATH=${prefix}" "-DCMAKE_CXX_COMPILER=${FO_CXX_COMPILER}" "-DCUDAToolkit_ROOT=${FO_CUDA_ROOT}")
run("building examples/cpp" "${CMAKE_COMMAND}" --build "${example}")
run("running the example" "${example}/flashoverlap_example")
message(STATUS "example: exit 0\n${run_output}")
# As the GPU tests: where FO_REQUIRE_GPUS promises a GPU, not running is a failure.
if("$ENV{FO_REQUIRE_GPUS}" GREATER 0 AND run_output MATCHES "no CUDA GPU: nothing to run")
  message(FATAL_ERROR "FO_REQUIRE_GPUS=$ENV{FO_REQUIRE_GPUS} but the example found no CUDA GPU")
endif()

# 3. add_subdirectory, without CMAKE_CXX_STANDARD.
set(consumer "${FO_WORK_DIR}/subdir-consumer")
file(WRITE "${consumer}/CMakeLists.txt" "\
cmake_minimum_required(VERSION 3.25)
project(consumer LANGUAGES CXX)
set(FO_BUILD_TESTS OFF)
set(FO_BUILD_BENCH OFF)
add_subdirectory(\"${FO_SOURCE_DIR}\" flashoverlap)
add_executable(consumer main.cpp)
target_link_libraries(consumer PRIVATE FlashOverlap::flashoverlap fo_plan)
")
file(WRITE "${consumer}/main.cpp" "\
#include <flashoverlap/flashoverlap.h>
#include \"plan/partition.h\"
static_assert(__cplusplus >= 202002L, \"the FlashOverlap targets carry C++20\");
int main() { return flashoverlap::version() == nullptr; }
")
set(cuda_host)
if(FO_CUDA_HOST_COMPILER)
  set(cuda_host "-DCMAKE_CUDA_HOST_COMPILER=${FO_CUDA_HOST_COMPILER}")
endif()
run("configuring the add_subdirectory consumer" "${CMAKE_COMMAND}" -S "${consumer}" -B "${consumer}/build"
    -G "Unix Makefiles" "-DCMAKE_CXX_COMPILER=${FO_CXX_COMPILER}" "-DCMAKE_CUDA_COMPILER=${FO_CUDA_COMPILER}"
    ${cuda_host})
run("compiling the add_subdirectory consumer" "${CMAKE_COMMAND}" --build "${consumer}/build" --target main.cpp.o)
message(STATUS "add_subdirectory consumer: compiles as C++20 without CMAKE_CXX_STANDARD")
