# CUDA-path tests, included from test/CMakeLists.txt.
# CPU-runnable: the GEMM layout mapping the CUDA backend uses, and the paper performance model.
saetrain_add_test(test_gemm_layout saetrain::cpu)
saetrain_add_test(test_perfmodel saetrain::core)
add_dependencies(test_perfmodel sae-perfmodel)  # its CLI test runs the program

# GPU tests (label `gpu`): without a visible CUDA device they skip, naming the reason, and ctest
# reports them as skipped (GoogleTest's "[  SKIPPED ]" line), never as passed. `ctest -L gpu` is
# the first thing to run on a GPU node. The CUDA backend's parity with the CPU is
# test_backend_parity's cuda instance (test/CMakeLists.txt); here what only CUDA has.
set(_gtest_skipped "\\[  SKIPPED \\]")
if(SAETRAIN_CUDA)
    saetrain_add_test(test_cuda_backend saetrain::cuda)
    set_tests_properties(test_cuda_backend PROPERTIES LABELS gpu
        SKIP_REGULAR_EXPRESSION "${_gtest_skipped}")

    # The GPU communicators against MPI: an MPI program (own main) run under mpirun at 2 ranks
    # (all ranks skip when any sees no device), one ctest entry per communicator so that the
    # host-staged one shows as passed on a one-GPU node, where NCCL's cases skip (and the
    # CUDA-aware MPI ones where MPI is not); `agreed` is what Backend::gradient_comm chooses.
    # `delay`: the collective-delay debug mode (SAETRAIN_DEBUG_COLLECTIVE_DELAY_US).
    add_executable(test_cuda_comm test_cuda_comm.cpp)
    target_link_libraries(test_cuda_comm PRIVATE saetrain::cuda saetrain::comm GTest::gtest)
    saetrain_set_warnings(test_cuda_comm)
    foreach(comm nccl staged ordered agreed delay)
        if(comm STREQUAL "delay")
            set(_filter "CollectiveDelay*")
        else()
            set(_filter "Comm/GpuCommVsMpi.*/${comm}")
        endif()
        add_test(NAME test_cuda_comm_${comm}_np2
            COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe
                    $<TARGET_FILE:test_cuda_comm> --gtest_filter=${_filter})
        set_tests_properties(test_cuda_comm_${comm}_np2 PROPERTIES LABELS gpu TIMEOUT 300
            PROCESSORS 2 SKIP_REGULAR_EXPRESSION "${_gtest_skipped}"
            ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
    endforeach()
endif()
