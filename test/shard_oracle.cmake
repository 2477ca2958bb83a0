# saetrain_shard_oracle: the tests' independent read of shard rows (test/shard_oracle.h), for
# the tests here and the fuzzers in test/fuzz (built without the tests), whichever comes first.
if(NOT TARGET saetrain_shard_oracle)
    add_library(saetrain_shard_oracle STATIC ${CMAKE_CURRENT_LIST_DIR}/shard_oracle.cpp)
    target_include_directories(saetrain_shard_oracle PUBLIC ${CMAKE_CURRENT_LIST_DIR})
    target_link_libraries(saetrain_shard_oracle PUBLIC saetrain::io PRIVATE hdf5::hdf5)
    saetrain_set_warnings(saetrain_shard_oracle)
endif()
