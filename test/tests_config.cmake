saetrain_add_test(test_config saetrain::core)
saetrain_add_test(test_tensorboard saetrain::core)
saetrain_add_test(test_config_lists saetrain::io)
