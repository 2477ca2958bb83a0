saetrain_add_test(test_partition saetrain::io)
saetrain_add_test(test_shards saetrain::io)
saetrain_add_test(test_synth saetrain::io)
saetrain_add_test(test_checkpoint saetrain::io)
