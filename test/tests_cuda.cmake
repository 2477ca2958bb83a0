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

# NCCL against MPI: an MPI program (own main), built here; the mpirun wiring (2 and 4 ranks,
# label gpu) is added beside the other MPI tests, e.g.
#   mpirun -np 2 test_cuda_nccl
if(SAETRAIN_CUDA AND SAETRAIN_NCCL)
    add_executable(test_cuda_nccl test_cuda_nccl.cpp)
    target_link_libraries(test_cuda_nccl PRIVATE saetrain::cuda saetrain::comm GTest::gtest)
    saetrain_set_warnings(test_cuda_nccl)
endif()
