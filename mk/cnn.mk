# CNN kernels (issue 4, item 7). `make bench-cnn-full`: the issue's CNN-2D + GAP size, 256
# Fashion-MNIST images at depth 4 (a few minutes on 2 cores; make bench runs the same size by
# default, and 32 images for its `4096 --no-naive` call).
.PHONY: bench-cnn-full
bench-cnn-full: $(BUILD)/bench/bench_cnn
	$(BUILD)/bench/bench_cnn --images=256 --depth=4
