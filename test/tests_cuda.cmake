# CUDA-path tests, included from test/CMakeLists.txt.
# CPU-runnable: the GEMM layout mapping the CUDA backend uses, and the paper performance model.
saetrain_add_test(test_gemm_layout saetrain::core)
saetrain_add_test(test_perfmodel saetrain::core)
