# Compiles SOURCE, expecting failure with a diagnostic that contains the text after "// expect: ".
file(STRINGS ${SOURCE} expect_line REGEX "^// expect: " LIMIT_COUNT 1)
string(REGEX REPLACE "^// expect: " "" expect "${expect_line}")
# A file with the line "// needs: interpret" compiles in interpret mode, as the octet::interpret target
# builds (the interpreter's headers, CUDA_INCLUDE: the toolkit's, octet/interpret/cuda.hpp force-included).
file(STRINGS ${SOURCE} interpret_line REGEX "^// needs: interpret" LIMIT_COUNT 1)
set(mode_flags "")
if(interpret_line)
  set(mode_flags -DOCTET_INTERPRET -I${INCLUDE}/../interpret/include -isystem ${CUDA_INCLUDE}
                 -include octet/interpret/cuda.hpp)
endif()
execute_process(COMMAND ${CXX} -std=c++17 -fsyntax-only -I${INCLUDE} ${mode_flags} ${SOURCE}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled, but it should fail with: ${expect}")
endif()
string(FIND "${out}${err}" "${expect}" found)
if(found EQUAL -1)
  message(FATAL_ERROR "${SOURCE} failed without the expected message '${expect}':\n${err}")
endif()
message(STATUS "failed as expected: ${expect}")
