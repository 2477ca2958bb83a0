# The fuzzers' corpora and minimized findings, replayed in the normal build (no clang needed):
# test/test_fuzz_regressions.cpp through the fuzzers' own entry points (test/fuzz/fuzz_entry.*).
saetrain_add_test(test_fuzz_regressions saetrain::io saetrain_shard_oracle)
target_sources(test_fuzz_regressions PRIVATE fuzz/fuzz_entry.cpp)
target_link_libraries(test_fuzz_regressions PRIVATE hdf5::hdf5)
target_include_directories(test_fuzz_regressions PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/fuzz)
target_compile_definitions(test_fuzz_regressions PRIVATE
    SAETRAIN_FUZZ_DIR="${CMAKE_CURRENT_SOURCE_DIR}/fuzz")
