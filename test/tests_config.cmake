saetrain_add_test(test_config saetrain::core)
