# CUDA-path tests, included from test/CMakeLists.txt.
# CPU-runnable: the GEMM layout mapping the CUDA backend uses, and the paper performance model.
saetrain_add_test(test_gemm_layout saetrain::core)
saetrain_add_test(test_perfmodel saetrain::core)

# GPU tests (label `gpu`): parity with the CPU backend. They skip, naming the reason, when no
# CUDA device is visible; `ctest -L gpu` is the first thing to run on a GPU node.
if(SAETRAIN_CUDA)
    saetrain_add_test(test_cuda_backend saetrain::cpu saetrain::cuda)
    set_tests_properties(test_cuda_backend PROPERTIES LABELS gpu)
endif()

# NCCL against MPI: an MPI program (own main) run under mpirun at 2 ranks (label gpu; all
# ranks skip when any sees no device).
if(SAETRAIN_CUDA AND SAETRAIN_NCCL)
    add_executable(test_cuda_nccl test_cuda_nccl.cpp)
    target_link_libraries(test_cuda_nccl PRIVATE saetrain::cuda saetrain::comm GTest::gtest)
    saetrain_set_warnings(test_cuda_nccl)
    add_test(NAME test_cuda_nccl_np2
        COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe
                $<TARGET_FILE:test_cuda_nccl>)
    set_tests_properties(test_cuda_nccl_np2 PROPERTIES LABELS gpu TIMEOUT 300 PROCESSORS 2
        ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
endif()
