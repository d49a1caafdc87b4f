# Builds tests/consumers/main.cpp with nothing but the compiler and -I include, then runs it.
execute_process(COMMAND ${CXX} -std=c++17 -O1 -I${INCLUDE} ${SOURCE} -o ${OUT} -pthread RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "plain -I include build failed")
endif()
execute_process(COMMAND ${OUT} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "plain -I include consumer returned ${rc}")
endif()
