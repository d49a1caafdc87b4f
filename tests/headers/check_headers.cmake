# Compiles every public header of octet (include/octet/**/*.hpp, and the CUDA interpreter's,
# interpret/include/octet/interpret/*.hpp, when INTERPRET_INCLUDE names that folder) alone, then all of them in one
# translation unit in sorted and in reverse order, with -fsyntax-only and warnings as errors:
# a header must include what it uses, and must not change the meaning of another (a name found
# in the wrong namespace, a macro). Run by CTest (tests/headers/CMakeLists.txt):
#
#   cmake -DCXX=<compiler> -DSTD=<17|20> -DINCLUDE=<repo>/include -DWORK=<folder>
#         [-DINTERPRET_INCLUDE=<repo>/interpret/include [-DCUDA_INCLUDE=<toolkit include folder>]]
#         [-DMPI=ON -DMPI_INCLUDES=<dir>|<dir>] -P check_headers.cmake
#
# With CUDA_INCLUDE too, each interpreter header is also compiled alone in interpret mode, as the
# octet::interpret target builds (-DOCTET_INTERPRET, octet/interpret/cuda.hpp force-included), with
# octet's include folder left off: the interpreter must not need octet's library headers.
#
# The headers are globbed when the test runs, so a new header is checked without reconfiguring.
# A header that includes <mpi.h> is checked only when MPI is ON.
foreach(var CXX STD INCLUDE WORK)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_headers.cmake: pass -D${var}=...")
  endif()
endforeach()

file(GLOB_RECURSE headers RELATIVE ${INCLUDE} ${INCLUDE}/octet/*.hpp)
set(interpret_headers "")
if(INTERPRET_INCLUDE)
  file(GLOB_RECURSE interpret_headers RELATIVE ${INTERPRET_INCLUDE} ${INTERPRET_INCLUDE}/octet/interpret/*.hpp)
  list(APPEND headers ${interpret_headers})
endif()
list(SORT headers)
set(flags -std=c++${STD} -Wall -Wextra -Wpedantic -Werror -fsyntax-only -I${INCLUDE})
if(INTERPRET_INCLUDE)
  list(APPEND flags -I${INTERPRET_INCLUDE})
endif()
if(CUDA_INCLUDE)  # the interpreter's TMA model reads the toolkit's <cuda.h> (its enums; nothing linked)
  list(APPEND flags -isystem ${CUDA_INCLUDE})
endif()
if(MPI_INCLUDES)
  string(REPLACE "|" ";" MPI_INCLUDES "${MPI_INCLUDES}")
  foreach(dir ${MPI_INCLUDES})
    list(APPEND flags -isystem ${dir})
  endforeach()
endif()
file(MAKE_DIRECTORY ${WORK})

set(checked "")
set(failed "")
# compile(<name> <source text>): one translation unit; prints the diagnostics of a failure.
function(compile name text)
  file(WRITE ${WORK}/${name}.cpp "${text}")
  execute_process(COMMAND ${CXX} ${flags} ${WORK}/${name}.cpp
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message("---- ${name} (${WORK}/${name}.cpp) ----\n${out}")
    set(failed ${failed} ${name} PARENT_SCOPE)
  endif()
endfunction()

foreach(h ${headers})
  set(root ${INCLUDE})
  if(NOT EXISTS ${INCLUDE}/${h})
    set(root ${INTERPRET_INCLUDE})
  endif()
  file(STRINGS ${root}/${h} needs_mpi REGEX "^#include <mpi\\.h>")
  if(needs_mpi AND NOT MPI)
    message(STATUS "not checked: ${h} (needs <mpi.h>; MPI was not found when the tests were configured)")
    continue()
  endif()
  file(STRINGS ${root}/${h} needs_cuda_h REGEX "^#include <cuda\\.h>")
  if(needs_cuda_h AND NOT CUDA_INCLUDE)
    message(STATUS "not checked: ${h} (needs the toolkit's <cuda.h>; no CUDA toolkit was found)")
    continue()
  endif()
  list(APPEND checked ${h})
  # Twice: the second include must be a no-op (#pragma once).
  compile(${h} "#include <${h}>\n#include <${h}>\n")
endforeach()

# The interpreter's headers alone in interpret mode, without octet's include folder.
if(interpret_headers AND CUDA_INCLUDE)
  set(library_flags ${flags})
  set(flags -std=c++${STD} -Wall -Wextra -Wpedantic -Werror -fsyntax-only -I${INTERPRET_INCLUDE}
            -isystem ${CUDA_INCLUDE} -DOCTET_INTERPRET -include octet/interpret/cuda.hpp)
  foreach(h ${interpret_headers})
    compile(interpret-mode/${h} "#include <${h}>\n#include <${h}>\n")
  endforeach()
  set(flags ${library_flags})
endif()

set(forward "")
foreach(h ${checked})
  string(APPEND forward "#include <${h}>\n")
endforeach()
compile(all_sorted "${forward}")
set(reversed ${checked})
list(REVERSE reversed)
set(backward "")
foreach(h ${reversed})
  string(APPEND backward "#include <${h}>\n")
endforeach()
compile(all_reversed "${backward}")

list(LENGTH checked n)
list(LENGTH failed n_failed)
if(failed)
  list(JOIN failed "\n  " failed_list)
  message(FATAL_ERROR "${n_failed} of ${n} headers (and the two all-in-one units) failed with ${CXX} -std=c++${STD}:\n  ${failed_list}")
endif()
message(STATUS "${n} headers compile alone and together (sorted and reversed) with ${CXX} -std=c++${STD}")
