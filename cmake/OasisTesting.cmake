# oasis_add_test(NAME <name> SOURCES <files...> LIBS <targets...> [GPU])
#
# CPU tests: one Catch2 executable whose test cases are registered one by one in CTest.
# GPU tests (GPU): linked with a main that exits 77 when no CUDA device is present; CTest
# reports them as skipped (SKIP_RETURN_CODE 77) and labels them `gpu`.
include(Catch)

function(oasis_add_test)
  cmake_parse_arguments(T "GPU" "NAME" "SOURCES;LIBS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} oasis_test_support)
  if(T_GPU)
    target_link_libraries(${T_NAME} PRIVATE oasis_gpu_test_main)
    add_test(NAME ${T_NAME} COMMAND ${T_NAME})
    set_tests_properties(${T_NAME} PROPERTIES SKIP_RETURN_CODE 77 LABELS gpu)
  else()
    target_link_libraries(${T_NAME} PRIVATE oasis_catch_main)
    catch_discover_tests(${T_NAME} TEST_PREFIX "${T_NAME}:" PROPERTIES LABELS cpu)
  endif()
endfunction()
