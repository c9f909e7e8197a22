# Read by ctest after the gtest-discovered test lists (TEST_INCLUDE_FILES): every loadgen test gets
# the label `loadgen`, the pure ones `unit` too. (gtest_discover_tests flattens a list given in
# its PROPERTIES, so specula_add_test's LABELS can carry only one label.)
foreach(test IN LISTS loadgen_arrivals_test_TESTS loadgen_dataset_test_TESTS
        loadgen_report_test_TESTS loadgen_progress_bar_test_TESTS)
  set_tests_properties("${test}" PROPERTIES LABELS "loadgen;unit")
endforeach()
foreach(test IN LISTS loadgen_serve_test_TESTS)
  set_tests_properties("${test}" PROPERTIES LABELS loadgen)
endforeach()
